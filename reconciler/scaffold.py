"""``argus init DIR``: scaffold a new config repository. I/O (writes files; reads argus's own git commit), no network.

The scaffold is what a cluster's users clone: ``cluster.yaml``, one example user with a model and a task,
a README for users, the JSON Schemas copied under ``.argus/schemas/`` with ``yaml-language-server``
modelines pointing at them by relative path (editors validate as users type, offline, against exactly the
schemas of the argus version that made the repository), a ``.pre-commit-config.yaml`` running
``argus validate --offline`` and a CI definition that runs ``argus validate`` and ``argus plan`` on every
pull request (``--ci github``, the default: a GitHub Actions workflow that posts the plan as a comment;
``--ci gitlab``: a GitLab CI job on merge requests; ``--ci none``). The same files are in ``examples/ci/``.

Two kinds of files: the **user files** (``cluster.yaml``, ``users/**``, ``README.md``) are written once, when
a repository is created, and never again; the **generated files** (schemas, pre-commit config, workflow,
editor settings) are argus's and ``argus init --force`` rewrites exactly those.

Where CI and pre-commit get argus from is one setting, the *argus source* ``git+<URL>@<REV>``: argus is not
published on a package index (a name there could be claimed by anyone, and would run in every config
repository's CI), so the workflow and README install ``argus-reconciler @ git+<URL>@<REV>`` and the
pre-commit example names ``repo: <URL>`` with ``rev: <REV>``. The default pins the commit this argus runs
from (a revision that exists: the checkout's, or the one recorded in the package at build time) at a URL
placeholder the admin replaces; when that commit is unknown, the release tag ``v<version>``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass

from reconciler import __version__, git
from reconciler.errors import ArgusError, GitError
from reconciler.spec.loader import USER_RE, USER_RULE
from reconciler.spec.schema import SCHEMA_FILES, schema_text

SCHEMA_DIR = ".argus/schemas"
URL_PLACEHOLDER = "https://<git host>/<org>/argus.git"
REV_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# Written only when a repository is created; --force never touches them.
USER_FILES = ("cluster.yaml", "README.md", ".gitlab-ci.yml")
GITHUB_WORKFLOW = ".github/workflows/argus.yaml"
# GitLab reads one .gitlab-ci.yml, which may hold a project's other jobs: it is written once (a user file)
# and includes argus's job from a file of its own, which --force refreshes.
GITLAB_JOB = ".gitlab/argus.gitlab-ci.yml"
CI_KINDS = ("github", "gitlab", "none")
USER_DIRS = ("users/",)


@dataclass(frozen=True)
class ArgusSource:
    """Where config repositories install argus from: a git URL and a pinned revision (commit or tag)."""

    url: str
    rev: str

    @property
    def pip(self) -> str:
        """The pip requirement of the PR check: ``argus-reconciler[check] @ git+<url>@<rev>`` (the base
        package plus hydra, so task overrides and engine_kwargs are checked against the pinned verl's
        config and vLLM's engine arguments that ship inside argus)."""
        return f"argus-reconciler[check] @ git+{self.url}@{self.rev}"

    @property
    def placeholder(self) -> bool:
        """True while the URL is still the placeholder the admin must replace."""
        return "<" in self.url


def parse_source(text: str) -> ArgusSource:
    """Parse ``git+<URL>@<REV>`` (pip's VCS form; ``argus-reconciler @`` or ``argus-reconciler[check] @``
    in front is accepted).

    Raises ArgusError when the text is not that form: an unpinned source would install whatever the
    branch holds on the day CI runs.
    """
    text = text.strip().removeprefix("argus-reconciler").strip()
    text = re.sub(r"^\[[A-Za-z0-9_,\s-]*\]", "", text).strip().removeprefix("@").strip()
    url, _, rev = text.removeprefix("git+").rpartition("@")
    # The revision follows the last "@" (a URL may hold one too: ssh://git@host/...) and has no "/".
    if (
        not text.startswith("git+")
        or not url
        or "://" not in url
        or any(c.isspace() for c in url)
        or not REV_RE.match(rev)
    ):
        raise ArgusError(
            f"--argus-source {text!r}: expected git+<URL>@<REV>, a git URL pinned to a commit or tag "
            "(e.g. git+https://github.com/<org>/argus.git@<commit>)"
        )
    return ArgusSource(url, rev)


BUILD_COMMIT_FILE = "_build_commit.txt"  # written into the package by setup.py when built from a checkout


def argus_version() -> str:
    """The installed distribution's version (``importlib.metadata``), else the package's ``__version__``
    (running from a checkout that was never installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("argus-reconciler")
    except PackageNotFoundError:
        return __version__


def argus_commit() -> str | None:
    """The commit this argus runs from: the live checkout's HEAD (an editable install, a clone on the
    path), else the commit recorded in the package when it was built from a checkout (pip builds
    ``git+<URL>@<REV>`` from a clone; see setup.py). Returns None when neither is known (a wheel built
    from an sdist or outside git)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    if os.path.exists(os.path.join(root, ".git")):
        try:
            out = git.probe(root, "rev-parse", "--verify", "-q", "HEAD^{commit}", timeout=10)
        except GitError:
            out = None
        sha = out.stdout.decode(errors="replace").strip() if out is not None and out.returncode == 0 else ""
        if re.fullmatch(r"[0-9a-f]{40}", sha):
            return sha
    try:
        with open(os.path.join(here, BUILD_COMMIT_FILE), encoding="ascii") as fh:
            recorded = fh.read(100).strip()
    except (OSError, UnicodeDecodeError):
        return None
    return recorded if re.fullmatch(r"[0-9a-f]{40}", recorded) else None


def default_source() -> ArgusSource:
    """The URL placeholder pinned to the commit this argus runs from (:func:`argus_commit`); when that
    commit is unknown, pinned to the release tag ``v<version>`` instead, with a note on stderr (the tag
    exists only where the release step pushed it: ``--argus-source ...@<commit>`` is the pin that always
    works). Returns the source; raises nothing."""
    commit = argus_commit()
    if commit is not None:
        return ArgusSource(URL_PLACEHOLDER, commit)
    tag = f"v{argus_version()}"
    print(
        f"note: this argus does not know its commit (installed from a wheel built outside a git checkout): pinning "
        f"the release tag {tag}; if your argus repository has no such tag, pass --argus-source "
        "git+<argus repository URL>@<commit>",
        file=sys.stderr,
    )
    return ArgusSource(URL_PLACEHOLDER, tag)


def current_source(dir: str) -> ArgusSource | None:
    """The argus source a repository's generated CI (GitHub workflow or GitLab job) already installs
    from, or None (no such file, or one that does not hold a pinned git source)."""
    for rel in (GITHUB_WORKFLOW, GITLAB_JOB):
        try:
            with open(os.path.join(dir, *rel.split("/")), encoding="utf-8") as fh:
                text = fh.read(1 << 20)
        except OSError:
            continue
        match = re.search(r'^\s*ARGUS_PACKAGE:\s*"?([^"\n]+?)"?\s*$', text, re.M)
        if not match:
            continue
        try:
            return parse_source(match.group(1))
        except ArgusError:
            continue
    return None


def current_ci(dir: str) -> str:
    """Which CI the generated files of the repository in ``dir`` are for: ``github``, ``gitlab`` or
    ``none`` (what ``argus init --force`` refreshes when ``--ci`` is not given)."""
    if os.path.lexists(os.path.join(dir, *GITHUB_WORKFLOW.split("/"))):
        return "github"
    if os.path.lexists(os.path.join(dir, *GITLAB_JOB.split("/"))):
        return "gitlab"
    return "none"


def is_user_file(rel: str) -> bool:
    """True for files that belong to the repository's users and admins, never rewritten by argus."""
    return rel in USER_FILES or rel.startswith(USER_DIRS)


def _modeline(path: str, kind: str) -> str:
    """``# yaml-language-server: $schema=<relative path to .argus/schemas/...>`` for a file at ``path``."""
    up = "../" * path.count("/")
    return f"# yaml-language-server: $schema={up}{SCHEMA_DIR}/{SCHEMA_FILES[kind]}\n"


CLUSTER = """\
# The cluster's settings, owned by its admins (changes need an admin's review).
# Every field is optional; the schema (.argus/schemas/cluster.schema.json) documents the defaults.
kind: Cluster
users:                       # who may have a users/<user>/ folder, and their GPU quota
  {user}: {{gpus: 4}}
paths:
  common: /private/hf        # the shared Hugging Face cache: $HOME/common/hf in users' files
  users: /private/users      # user homes: $HOME is /private/users/<user>
serving:
  accelerator: gpu
  http_port: 8000            # the OpenAI-compatible endpoint: http://<head>:8000/v1
  internal_http_port: 8001   # Ray Serve's own proxy behind it: the cluster's internal network only
  proxy_location: HeadOnly
training:
  rollout: vllm
  driver_resources: {{worker_node: 1}}   # training drivers run on GPU workers, never on the head
env:
  HF_HUB_OFFLINE: "1"        # models are read from the shared cache, never downloaded by replicas
  HF_HOME: /private/hf
prune:                       # the mass-deletion guard
  max_fraction: 0.5
  min_deletions: 3
"""

MODEL = """\
# A model served behind the cluster's OpenAI endpoint. Its name there (OpenAI `model=`) is
# {user}-<YYYYMMDDHHMM>-chat: the time of the commit that added this file (`argus status` shows it).
kind: Model
source: Qwen/Qwen2.5-0.5B-Instruct   # an HF repo id already in the shared cache, or a path under $HOME
replicas: 1
gpus_per_replica: 1                  # tensor-parallel size
engine_kwargs:
  max_model_len: 4096
  gpu_memory_utilization: 0.85
"""

TASK = """\
# A training task, run once as a Ray Job (change `run:` to run an unchanged spec again).
kind: Task
workload: grpo                       # ppo | grpo | sft | command
model: Qwen/Qwen2.5-0.5B-Instruct
data:
  train: $HOME/data/gsm8k/train.parquet
  val: $HOME/data/gsm8k/test.parquet
nodes: 1
gpus_per_node: 1
steps: 10                            # optimizer steps; or epochs: N passes (both: whichever comes first)
overrides: []                        # extra verl settings, e.g. "actor_rollout_ref.actor.optim.lr=1e-6"
run: 1
suspend: true                        # remove this line to start training when merged
"""

README = """\
# Cluster configuration

This repository is the desired state of our Ray GPU cluster. The argus daemon on the cluster deploys
whatever `{branch}` says, and writes what happened back to git: the `argus/status` branch (one file per
object and a README table) and notes on each commit (`git log --notes=argus`).

```
cluster.yaml                      # admins: users, quotas, paths, serving and training settings
users/<user>/models/<name>.yaml   # one served model per file   (kind: Model)
users/<user>/tasks/<name>.yaml    # one training task per file   (kind: Task)
```

## Working here

1. Install the checker once: the same argus the cluster's CI uses, from its git repository pinned to a
   revision (not from a package index), with the `check` extra (hydra; no Ray, no GPU, no verl or vLLM:
   their config and engine-argument tables ship inside argus); then pre-commit, so that every commit is
   validated:
   ```
   pip install "{pip}"
   pip install pre-commit && pre-commit install
   ```
2. Add or edit a file under `users/<you>/`. Editors with the YAML language server (VS Code's YAML extension,
   Neovim, JetBrains) complete and check fields as you type: each file names its schema on its first line,
   and `.vscode/settings.json` maps new files to the schemas too.
3. `argus validate --offline .` prints every error as `path:line: message`.
4. Open a pull request. CI posts the plan (what will be deployed, restarted, stopped or queued for GPUs) as a
   comment; merge when it says what you meant.
5. After the merge, `argus status <you>` (or the `argus/status` branch) shows your objects' state, and
   `git log --notes=argus -1` what the daemon did with your commit.

Call a model with any OpenAI client: `base_url = "http://<head>:8000/v1"`, `model = "<served name>"`.

Paths: `$HOME` is your folder on the cluster, `$HOME/common/hf` the shared Hugging Face cache. Paths outside
them, other users' folders and models not yet in the cache are errors (download a model into the cache first).

Schemas: `.argus/schemas/` (copied by `argus init` from argus {version}). Admins refresh the generated
files (schemas, `.pre-commit-config.yaml`, the CI job, `.vscode/settings.json`) after
upgrading argus with `argus init --force --argus-source 'git+<URL>@<REV>' .` and review the diff;
`cluster.yaml`, `users/` and this README are never touched.
"""

PRE_COMMIT = """\
# Generated by `argus init` (refreshed by `argus init --force`).
# pre-commit install   # once per clone; then every commit runs `argus validate --offline`
# Uses the argus on your PATH (pip install "{pip}"), so it works offline and needs nothing else;
# the `check` extra makes it check task overrides and engine_kwargs as the cluster does.
# To let pre-commit install argus itself instead, use the hook argus ships:
#   - repo: {url}
#     rev: {rev}
#     hooks: [{{id: argus-validate}}]
repos:
  - repo: local
    hooks:
      - id: argus-validate
        name: argus validate --offline
        entry: argus validate --offline
        language: system
        pass_filenames: false
        files: ^(cluster\\.yaml|users/)
"""

WORKFLOW = """\
# Generated by `argus init` (refreshed by `argus init --force`).
# On every pull request: validate the change and post `argus plan` as a comment, so the review sees what
# will be deployed, restarted, stopped or queued before merging.
name: argus
on:
  pull_request:
    paths: ["cluster.yaml", "users/**", ".github/workflows/argus.yaml"]

permissions:
  contents: read
  pull-requests: write

concurrency:
  group: argus-${{{{ github.event.pull_request.number }}}}
  cancel-in-progress: true

env:
  # The base package with the `check` extra (hydra: task overrides are composed against verl's config and
  # engine_kwargs checked against vLLM's engine arguments, both shipped inside argus; no Ray, no vLLM, no verl):
  # installs in seconds. From argus's git repository pinned to a revision (argus is not on a package index);
  # set with `argus init --force --argus-source git+<URL>@<REV>`.
  ARGUS_PACKAGE: "{pip}"
  # The cluster's actual state: the daemon's status branch when it publishes actual.json there, else the file
  # named here (commit one exported from the cluster, or leave it absent to plan against an empty cluster).
  ARGUS_STATUS_BRANCH: argus/status
  ARGUS_ACTUAL_FILE: .argus/actual.json

jobs:
  plan:
    runs-on: ubuntu-latest
    timeout-minutes: 10
    steps:
      - uses: actions/checkout@v4
        with:
          fetch-depth: 0   # full history: served model names come from the commit that added each file

      - uses: actions/setup-python@v5
        with:
          python-version: "3.11"

      - name: Install argus
        run: python -m pip install --quiet "$ARGUS_PACKAGE"

      - name: Actual state
        run: |
          if git fetch --quiet --depth=1 origin "$ARGUS_STATUS_BRANCH" 2>/dev/null \\
             && git show FETCH_HEAD:actual.json > "$RUNNER_TEMP/actual.json" 2>/dev/null; then
            echo "actual state: the $ARGUS_STATUS_BRANCH branch"
          elif [ -f "$ARGUS_ACTUAL_FILE" ]; then
            cp "$ARGUS_ACTUAL_FILE" "$RUNNER_TEMP/actual.json"
            echo "actual state: $ARGUS_ACTUAL_FILE"
          else
            echo '{{}}' > "$RUNNER_TEMP/actual.json"
            echo "actual state: none published; planning against an empty cluster"
          fi

      - name: Plan
        id: plan
        # argus plan exits 0 (no changes), 2 (changes pending: the normal case for a PR) or 1 (errors).
        run: |
          set +e
          argus plan . --offline --actual "$RUNNER_TEMP/actual.json" --format markdown > "$RUNNER_TEMP/plan.md"
          code=$?
          set -e
          echo "exit_code=$code" >> "$GITHUB_OUTPUT"
          cat "$RUNNER_TEMP/plan.md" >> "$GITHUB_STEP_SUMMARY"
          if [ "$code" -ne 0 ] && [ "$code" -ne 2 ]; then
            echo "::error::argus plan failed (exit $code)"
          fi

      - name: Comment the plan on the pull request
        # Pull requests from forks get a read-only token: the plan is still in the job summary.
        if: github.event.pull_request.head.repo.full_name == github.repository
        env:
          GH_TOKEN: ${{{{ github.token }}}}
          PR: ${{{{ github.event.pull_request.number }}}}
        run: |
          {{ echo "<!-- argus-plan -->"; cat "$RUNNER_TEMP/plan.md"; }} > "$RUNNER_TEMP/comment.md"
          gh pr comment "$PR" --edit-last --body-file "$RUNNER_TEMP/comment.md" \\
            || gh pr comment "$PR" --body-file "$RUNNER_TEMP/comment.md"

      - name: Validate
        # After the comment, so that a broken file's errors are in it too; this step fails the check.
        run: |
          argus validate --offline .
          code="${{{{ steps.plan.outputs.exit_code }}}}"
          [ "$code" = 0 ] || [ "$code" = 2 ]
"""


GITLAB_INCLUDE = """\
# GitLab CI. argus's merge-request check is included from its own file, which `argus init --force`
# refreshes; this file is yours (written once by `argus init --ci gitlab`): add your project's jobs here.
include:
  - local: {job}
"""

GITLAB_CI = """\
# Generated by `argus init --ci gitlab` (refreshed by `argus init --force`); included from .gitlab-ci.yml.
# On every merge request: validate the change and show `argus plan` (job log and the plan.md artifact; also
# posted as a merge-request note when the CI/CD variable ARGUS_GITLAB_TOKEN holds a token with the `api`
# scope), so the review sees what will be deployed, restarted, stopped or queued before merging.
variables:
  # The base package with the `check` extra, from argus's git repository pinned to a revision (argus is not
  # on a package index); set with `argus init --force --argus-source git+<URL>@<REV>`.
  ARGUS_PACKAGE: "{pip}"
  # The cluster's actual state: the daemon's status branch when it publishes actual.json there, else the file
  # named here (commit one exported from the cluster, or leave it absent to plan against an empty cluster).
  ARGUS_STATUS_BRANCH: argus/status
  ARGUS_ACTUAL_FILE: .argus/actual.json

argus-plan:
  image: python:3.11
  rules:
    - if: $CI_PIPELINE_SOURCE == "merge_request_event"
      changes: ["cluster.yaml", "users/**/*", "{job}"]
  variables:
    GIT_DEPTH: "0"   # full history: served model names come from the commit that added each file
  timeout: 10 minutes
  script:
    - python -m pip install --quiet "$ARGUS_PACKAGE"
    - |
      if git fetch --quiet --depth=1 origin "$ARGUS_STATUS_BRANCH" 2>/dev/null \\
         && git show FETCH_HEAD:actual.json > actual.json 2>/dev/null; then
        echo "actual state: the $ARGUS_STATUS_BRANCH branch"
      elif [ -f "$ARGUS_ACTUAL_FILE" ]; then
        cp "$ARGUS_ACTUAL_FILE" actual.json
        echo "actual state: $ARGUS_ACTUAL_FILE"
      else
        echo '{{}}' > actual.json
        echo "actual state: none published; planning against an empty cluster"
      fi
    # argus plan exits 0 (no changes), 2 (changes pending: the normal case for a merge request) or 1 (errors).
    - |
      set +e
      argus plan . --offline --actual actual.json --format markdown > plan.md
      code=$?
      set -e
      echo "$code" > plan.exit
      cat plan.md
    - |
      if [ -n "${{ARGUS_GITLAB_TOKEN:-}}" ] && [ -n "${{CI_MERGE_REQUEST_IID:-}}" ]; then
        curl --fail --silent --show-error --request POST --header "PRIVATE-TOKEN: $ARGUS_GITLAB_TOKEN" \\
          --data-urlencode "body@plan.md" \\
          "$CI_API_V4_URL/projects/$CI_PROJECT_ID/merge_requests/$CI_MERGE_REQUEST_IID/notes" > /dev/null
      fi
    # Last, so that a broken file's errors are in the plan too; this step fails the job.
    - argus validate --offline .
    - code="$(cat plan.exit)"; [ "$code" = 0 ] || [ "$code" = 2 ]
  artifacts:
    when: always
    paths: [plan.md]
"""


def ci_files(ci: str, source: ArgusSource) -> dict[str, str]:
    """The CI files of ``ci`` (``github``, ``gitlab`` or ``none``): repository-relative path -> content.
    Raises ArgusError for another value."""
    if ci == "github":
        return {GITHUB_WORKFLOW: WORKFLOW.format(pip=source.pip)}
    if ci == "gitlab":
        return {
            ".gitlab-ci.yml": GITLAB_INCLUDE.format(job=GITLAB_JOB),
            GITLAB_JOB: GITLAB_CI.format(pip=source.pip, job=GITLAB_JOB),
        }
    if ci == "none":
        return {}
    raise ArgusError(f"--ci {ci!r}: expected one of {', '.join(CI_KINDS)}")


def _vscode_settings() -> str:
    schemas = {
        f"./{SCHEMA_DIR}/{SCHEMA_FILES['Cluster']}": ["cluster.yaml"],
        f"./{SCHEMA_DIR}/{SCHEMA_FILES['Model']}": ["users/*/models/*.yaml"],
        f"./{SCHEMA_DIR}/{SCHEMA_FILES['Task']}": ["users/*/tasks/*.yaml"],
    }
    return json.dumps({"yaml.schemas": schemas}, indent=2) + "\n"


def files(
    user: str = "alice", branch: str = "main", source: ArgusSource | None = None, ci: str = "github"
) -> dict[str, str]:
    """The scaffold: repository-relative path -> content (user files and generated files).

    ``source`` defaults to :func:`default_source`; ``ci`` picks the CI files (:func:`ci_files`). Raises
    ArgusError for an invalid user name or ``ci``, or when no source is given and argus's own commit is
    unknown.
    """
    if not USER_RE.match(user):
        raise ArgusError(f"user {user!r}: must match {USER_RULE}")
    src = source or default_source()
    model, task = f"users/{user}/models/chat.yaml", f"users/{user}/tasks/gsm8k-grpo.yaml"
    out = {
        "cluster.yaml": _modeline("cluster.yaml", "Cluster") + CLUSTER.format(user=user),
        model: _modeline(model, "Model") + MODEL.format(user=user),
        task: _modeline(task, "Task") + TASK,
        "README.md": README.format(branch=branch, version=__version__, pip=src.pip),
        ".pre-commit-config.yaml": PRE_COMMIT.format(pip=src.pip, url=src.url, rev=src.rev),
        ".vscode/settings.json": _vscode_settings(),
        **ci_files(ci, src),
    }
    for kind, name in SCHEMA_FILES.items():
        out[f"{SCHEMA_DIR}/{name}"] = schema_text(kind)
    return out


def init_repo(
    dir: str, *, user: str = "alice", force: bool = False, source: ArgusSource | None = None, ci: str | None = None
) -> list[str]:
    """Write the scaffold into ``dir`` (created if needed) and return the paths written.

    ``ci`` (``github``, ``gitlab``, ``none``) picks the CI files; None means ``github`` for a new
    repository and, with ``force``, the CI the repository already has (:func:`current_ci`).

    Without ``force``: a new repository; refuses, writing nothing, when any scaffold file exists already.
    With ``force``: refreshes the generated files only (schemas, hooks, workflow, editor settings); user
    files (``cluster.yaml``, ``users/**``, ``README.md``) are neither overwritten nor created.
    Raises ArgusError as described, and as :func:`files` does.
    """
    content = files(user, source=source, ci=ci or (current_ci(dir) if force else "github"))
    if force:
        content = {rel: text for rel, text in content.items() if not is_user_file(rel)}
    targets = {rel: os.path.join(dir, *rel.split("/")) for rel in content}
    existing = sorted(rel for rel, path in targets.items() if os.path.lexists(path))
    if existing and not force:
        raise ArgusError(
            f"{dir}: would overwrite {', '.join(existing)} (to refresh only the generated files — schemas, "
            "hooks, workflow — use --force; cluster.yaml, users/ and README.md are never overwritten)"
        )
    created: list[str] = []
    for rel in sorted(content):
        path = targets[rel]
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        if os.path.islink(path):
            os.unlink(path)  # never write through a symlink
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            fh.write(content[rel])
        created.append(path)
    return created
