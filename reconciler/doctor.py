"""``argus doctor``: one line per part of an installation, ok or FAIL with what to do. I/O.

Run where the daemon runs, as the daemon (compose: ``docker compose exec argus argus-node argus doctor``); it
reads the same ``ARGUS_*`` settings as ``argus run``. Each check runs in its own daemon thread and is given
``timeout`` seconds: a wedged component (a dashboard that accepts the connection and never answers, a git
server that stalls) is reported as FAIL, it never hangs the command. Nothing is changed anywhere, except
one empty probe file created and removed in the state folder.
"""

from __future__ import annotations

import json
import os
import posixpath
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from reconciler import git
from reconciler.builders.serve import ROUTER_APP
from reconciler.dashboard import Clusters, Dashboard
from reconciler.errors import ArgusError, GitError
from reconciler.observe.api_keys import KeysFiles, known_users
from reconciler.observe.capacity import NODES_PATH
from reconciler.observe.serve import SERVE_APPS_PATH
from reconciler.source.remote import is_local
from reconciler.spec.loader import cluster_from
from reconciler.spec.types import ClusterSpec
from reconciler.status import blocking

# What one HTTP answer may hold (the nodes list of a large cluster is the biggest).
MAX_BODY = 8 * 1024 * 1024
MAX_CLUSTER_YAML = 256 * 1024
# The uid Ray jobs run as in the images (images/argus-ray-node/Dockerfile ARGUS_UID).
JOB_UID = 1000


class CheckFailed(ArgusError):
    """A check found a problem: ``str(exc)`` says what, ``fix`` what to do."""

    def __init__(self, message: str, fix: str = "") -> None:
        super().__init__(message)
        self.fix = fix


class CheckWarned(CheckFailed):
    """A check found something that works but deserves a look (an open endpoint): a ``warn`` line, not a FAIL."""


@dataclass(frozen=True)
class Result:
    """One check's outcome: ``detail`` is what was found; ``fix`` what to do when it failed."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    warning: bool = False  # ok, but worth a look (the exit status stays 0)

    def line(self) -> str:
        """``ok    name: detail``, ``warn  name: detail -> fix`` or ``FAIL  name: detail -> fix``."""
        tail = f" -> {self.fix}" if self.fix and (self.warning or not self.ok) else ""
        word = "warn" if self.warning else "ok  " if self.ok else "FAIL"
        return f"{word}  {self.name}: {self.detail}{tail}"


@dataclass(frozen=True)
class Settings:
    """What doctor checks against: the daemon's own settings (``argus run``'s flags and ARGUS_* variables)."""

    ray: str = "http://127.0.0.1:8265"
    repo: str | None = None
    branch: str = "main"
    status_branch: str = "argus/status"
    listen: str = "127.0.0.1:8080"
    serve_url: str = "auto"
    cache_dir: str = field(default_factory=lambda: os.path.expanduser("~/.cache/argus"))
    require_signed: bool = False
    allowed_signers: str | None = None
    admins: tuple[str, ...] = ()
    forge_signers: tuple[str, ...] = ()
    forge_pull_refs: str | None = None
    keys_dir: str | None = None
    api_keys: tuple[str, ...] = ()  # the API keys files (ARGUS_API_KEYS)
    timeout: float = 10.0


def _get(url: str, timeout: float, headers: Mapping[str, str] | None = None) -> tuple[int, bytes]:
    """GET ``url``; returns (status, at most MAX_BODY bytes of the body), HTTP errors included.
    Raises OSError (URLError) when nothing answers."""
    request = urllib.request.Request(url, headers=dict(headers or {}))
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return int(resp.status), resp.read(MAX_BODY)
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(64 * 1024)


def _git(settings: Settings, *args: str) -> str:
    """``git args`` (:mod:`reconciler.git`) with the check's timeout and an ssh that never prompts;
    returns stdout. Raises CheckFailed."""
    ssh = {} if "GIT_SSH_COMMAND" in os.environ else {"GIT_SSH_COMMAND": "ssh -o BatchMode=yes -o ConnectTimeout=5"}
    try:
        proc = git.probe(None, *args, timeout=settings.timeout, env=ssh)
    except GitError as exc:
        raise CheckFailed(str(exc)) from exc
    if proc.returncode != 0:
        stderr = proc.stderr.decode(errors="replace").strip()
        raise CheckFailed(f"git {' '.join(args[:2])}: {stderr[-300:] or f'exit {proc.returncode}'}")
    return proc.stdout.decode(errors="replace")


def _dashboard(settings: Settings) -> Dashboard:
    return Dashboard(settings.ray, timeout=settings.timeout)


def _serving_dashboard(settings: Settings) -> Dashboard:
    """The dashboard of the cluster models run on: cluster.yaml's ``serving.ray_address`` (with
    ``ARGUS_SERVING_RAY_TOKEN``), else the daemon's ``--ray``. Raises ArgusError (its token file)."""
    return Clusters(_dashboard(settings)).serving(_cluster(settings).serving.ray_address)


def _cluster(settings: Settings) -> ClusterSpec:
    """cluster.yaml of the deployed branch (a local repository only); its defaults when unreadable."""
    if not settings.repo or not is_local(settings.repo):
        return ClusterSpec()
    try:
        text = _git(settings, "-C", settings.repo, "show", f"refs/heads/{settings.branch}:cluster.yaml")
        data = yaml.safe_load(text[:MAX_CLUSTER_YAML]) if len(text) <= MAX_CLUSTER_YAML else None
        return cluster_from(data) if isinstance(data, dict) else ClusterSpec()
    except (ArgusError, yaml.YAMLError, TypeError, ValueError, AttributeError):
        return ClusterSpec()  # argus validate reports what is wrong with it; doctor checks the cluster


# The checks. Each returns its detail line when it passes and raises CheckFailed when it does not.


def check_dashboard(settings: Settings) -> str:
    try:
        version = _dashboard(settings).get("/api/version")
    except ArgusError as exc:
        fix = (
            "give the daemon the cluster's Ray auth token (RAY_AUTH_TOKEN_PATH, ARGUS_RAY_TOKEN)"
            if "refused argus's credentials" in str(exc)
            else "start the Ray head (docker compose logs head) or fix ARGUS_RAY"
        )
        raise CheckFailed(str(exc), fix) from exc
    ray = version.get("ray_version", "?") if isinstance(version, dict) else "?"
    return f"{settings.ray} answers with the daemon's credentials (Ray {ray})"


def check_jobs(settings: Settings) -> str:
    dash = _dashboard(settings)
    try:
        jobs = dash.get("/api/jobs/")
        nodes = _alive_nodes(dash)
    except ArgusError as exc:
        raise CheckFailed(str(exc), "check the Ray head's dashboard (docker compose logs head)") from exc
    if not isinstance(jobs, list):
        raise CheckFailed(f"GET /api/jobs/ answered {str(jobs)[:100]!r}", "check the Ray head's dashboard")
    if not nodes:
        raise CheckFailed("no Ray node is alive: jobs have nowhere to run", "start the nodes (docker compose up -d)")
    return f"the Jobs API answers ({len(jobs)} jobs); {len(nodes)} node(s) alive"


def _alive_nodes(dash: Dashboard) -> list[dict[str, Any]]:
    body = dash.get(NODES_PATH)
    try:
        nodes = body["data"]["result"]["result"]
    except (KeyError, TypeError) as exc:
        raise CheckFailed(f"the dashboard listed no nodes: {exc!r}") from exc
    return [n for n in nodes if isinstance(n, dict) and n.get("state") == "ALIVE"]


def check_serve(settings: Settings) -> str:
    try:
        body = _serving_dashboard(settings).get(SERVE_APPS_PATH) or {}
    except ArgusError as exc:
        raise CheckFailed(str(exc), "check the Ray head's dashboard") from exc
    apps = body.get("applications") if isinstance(body, dict) else None
    if not isinstance(body, dict) or body.get("http_options") is None:
        raise CheckFailed("Serve is not running", "push a valid cluster.yaml: the daemon starts Serve and its router")
    router = (apps or {}).get(ROUTER_APP) if isinstance(apps, dict) else None
    status = router.get("status") if isinstance(router, dict) else None
    if status != "RUNNING":
        message = str(router.get("message") or "")[:200] if isinstance(router, dict) else ""
        raise CheckFailed(
            f"Serve runs but the router {ROUTER_APP} is {status or 'not deployed'} {message}".rstrip(),
            "see `argus status` and docker compose logs head",
        )
    return f"Serve up, {ROUTER_APP} RUNNING, {len(apps or {})} application(s)"


def check_openai(settings: Settings) -> str:
    if settings.serve_url not in ("auto", "", "off"):
        base = settings.serve_url.rstrip("/")
    else:
        cluster = _cluster(settings)
        parts = urllib.parse.urlsplit(cluster.serving.ray_address or settings.ray)
        host = parts.hostname or "127.0.0.1"
        # Serve's own proxy (the endpoint forwards there, the daemon's probes ask there): no key needed.
        base = f"{parts.scheme or 'http'}://{host}:{cluster.serving.internal_http_port}"
    url = base + "/v1/models"
    try:
        status, body = _get(url, settings.timeout)
    except OSError as exc:
        raise CheckFailed(f"{url}: {exc}", "Serve's proxy does not answer: docker compose logs head") from exc
    if status == 401 and b"InvalidApiKey" in body:
        return f"{url} answers (API keys are on: 401 without a key)"  # the router's own refusal
    if status != 200:
        raise CheckFailed(f"{url}: HTTP {status} {body[:200]!r}", "see the router's messages (argus logs)")
    try:
        models = [m.get("id") for m in json.loads(body).get("data", [])]
    except (ValueError, AttributeError) as exc:
        raise CheckFailed(f"{url}: not an OpenAI model list ({exc})") from exc
    return f"{url} lists {len(models)} model(s)"


def _require_repo(settings: Settings) -> str:
    if not settings.repo:
        raise CheckFailed("no config repository is set", "set ARGUS_REPO (or --repo)")
    return settings.repo


def check_repository(settings: Settings) -> str:
    repo = _require_repo(settings)
    ref = f"refs/heads/{settings.branch}"
    if is_local(repo):
        out = _git(settings, "-C", repo, "for-each-ref", "--format=%(objectname)", ref).strip()
    else:
        out = _git(settings, "ls-remote", repo, ref).strip()
    if not out:
        raise CheckFailed(
            f"{repo} is readable but has no branch {settings.branch}",
            f"push the config repository's {settings.branch} (cluster.yaml first)",
        )
    return f"{repo} readable, {settings.branch} at {out.split()[0][:12]}"


def check_status_branch(settings: Settings) -> str:
    repo = _require_repo(settings)
    ref = f"refs/heads/{settings.status_branch}"
    if not is_local(repo):
        if not _git(settings, "ls-remote", repo, ref).strip():
            raise CheckFailed(
                f"{repo} has no {settings.status_branch}", "the daemon has not pushed it: docker compose logs argus"
            )
        return f"{settings.status_branch} present on {repo} (the daemon pushes it)"
    out = _git(settings, "-C", repo, "for-each-ref", "--format=%(committerdate:unix)", ref).strip()
    names = _git(
        settings, "-C", repo, "for-each-ref", "--format=%(refname)", *blocking.patterns(settings.status_branch)
    )
    blockers = blocking.blocking(names.split(), settings.status_branch)
    if blockers:  # the daemon can never create the branch: it submits nothing until they are gone
        raise CheckFailed(
            f"{repo} holds {blocking.describe(settings.status_branch, blockers)}: git cannot create "
            f"{settings.status_branch} beside it",
            f"delete or rename it: git -C {repo} update-ref -d {blockers[0]}",
        )
    if not out:
        raise CheckFailed(
            f"{repo} has no {settings.status_branch}",
            "the daemon writes it after its first tick on a valid branch: see docker compose logs argus",
        )
    git_dir = _git(settings, "-C", repo, "rev-parse", "--absolute-git-dir").strip()
    if not os.access(posixpath.join(git_dir, "refs"), os.W_OK | os.X_OK):
        raise CheckFailed(f"{git_dir}/refs is not writable by uid {os.getuid()}", "chown the repository to the daemon")
    # The daemon commits only when a state changes: an old commit on a quiet cluster is no fault.
    age = time.time() - int(out)
    return f"{settings.status_branch} writable, last written {age:.0f}s ago"


def check_healthz(settings: Settings) -> str:
    host, _, port = settings.listen.rpartition(":")
    host = "127.0.0.1" if host in ("", "0.0.0.0", "::", "[::]") else host
    url = f"http://{host}:{port}/healthz"
    try:
        status, body = _get(url, settings.timeout)
    except OSError as exc:
        raise CheckFailed(f"{url}: {exc}", "the daemon is not running: docker compose logs argus") from exc
    if status != 200:
        detail = body[:300].decode(errors="replace")
        raise CheckFailed(f"{url}: HTTP {status} {detail}", "see docker compose logs argus")
    return f"{url} 200"


def check_state_folder(settings: Settings) -> str:
    state = posixpath.join(settings.cache_dir, "state")
    folder = state if os.path.isdir(state) else settings.cache_dir
    probe = posixpath.join(folder, f".doctor-{os.getpid()}")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise CheckFailed(f"{folder} is not writable: {exc}", "chown the state folder to the daemon's uid") from exc
    mount, fstype = mount_of(folder)
    if fstype in ("tmpfs", "ramfs") or (mount == "/" and in_container()):
        raise CheckFailed(
            f"{folder} is on {fstype} at {mount}: lost when the container is recreated",
            "put ARGUS_CACHE_DIR on a volume (compose: argus-state)",
        )
    return f"{folder} writable, on {fstype} mounted at {mount}"


def in_container() -> bool:
    """True inside a Docker/Podman container (its root file system is the image's layers)."""
    return os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv")


def mount_of(path: str, mountinfo: str = "/proc/self/mountinfo") -> tuple[str, str]:
    """The mount point holding ``path`` and its file-system type (``("/", "?")`` when unknown)."""
    real = os.path.realpath(path)
    best, fstype = "/", "?"
    try:
        with open(mountinfo, encoding="utf-8", errors="replace") as fh:
            lines = fh.read(4 * 1024 * 1024).splitlines()
    except OSError:
        return best, fstype
    for line in lines:
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        point = fields[4].replace("\\040", " ")
        kind = line.split(" - ", 1)[1].split()[0]
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, fstype = point, kind
    return best, fstype


def check_ownership_key(settings: Settings) -> str:
    if os.environ.get("ARGUS_OWNERSHIP_KEY"):
        if len(os.environ["ARGUS_OWNERSHIP_KEY"]) < 16:
            raise CheckFailed("ARGUS_OWNERSHIP_KEY is shorter than 16 characters", "use `openssl rand -hex 32`")
        return "from ARGUS_OWNERSHIP_KEY"
    path = posixpath.join(settings.cache_dir, "state", "ownership.key")
    try:
        info = os.stat(path)
        with open(path, "rb") as fh:
            size = len(fh.read(4096).strip())
    except OSError as exc:
        raise CheckFailed(
            f"{path}: {exc.strerror}",
            "the daemon creates it on its first start; a new key makes every existing job foreign",
        ) from exc
    if info.st_mode & 0o077:
        raise CheckFailed(f"{path} is readable by others (mode {info.st_mode & 0o777:o})", f"chmod 600 {path}")
    if size < 16:
        raise CheckFailed(f"{path} is too short", "delete it; the daemon makes a new one (existing jobs turn foreign)")
    return f"{path} present (mode 600)"


def check_signing(settings: Settings) -> str:
    if not settings.require_signed:
        raise CheckFailed(
            "signing is off: any user who can push can change another user's folder and cluster.yaml",
            "set ARGUS_REQUIRE_SIGNED_COMMITS=1 with ARGUS_ALLOWED_SIGNERS and ARGUS_ADMINS",
        )
    if not settings.allowed_signers:
        raise CheckFailed("ARGUS_ALLOWED_SIGNERS is not set", "point it at a git allowed-signers file")
    try:
        with open(settings.allowed_signers, encoding="utf-8", errors="replace") as fh:
            lines = [line.split() for line in fh.read(1024 * 1024).splitlines() if line.strip()]
    except OSError as exc:
        raise CheckFailed(f"{settings.allowed_signers}: {exc.strerror}", "check the keys folder (/keys)") from exc
    principals = {p for line in lines if line and not line[0].startswith("#") for p in line[0].split(",")}
    if not principals:
        raise CheckFailed(f"{settings.allowed_signers} lists no key", "add keys/<user>.pub files")
    if not settings.admins:
        raise CheckFailed(
            f"no admins: nobody can change cluster.yaml ({len(principals)} signer(s))", "set ARGUS_ADMINS in .env"
        )
    keyless = [a for a in settings.admins if a not in principals]
    if keyless:
        raise CheckFailed(f"admin(s) without a key: {', '.join(keyless)}", "add keys/<admin>.pub")
    both = [f for f in settings.forge_signers if f in settings.admins]
    if both:
        raise CheckFailed(f"forge principal(s) also admin(s): {', '.join(both)}", "a forge may change nothing itself")
    # A forge without a key in the file: every merge it makes is refused, with no other sign.
    keyless = [f for f in settings.forge_signers if f not in principals]
    if keyless:
        raise CheckFailed(
            f"forge principal(s) without a key: {', '.join(keyless)}",
            "add the forge's SSH merge key to the allowed-signers file as `<name> ssh-ed25519 AAAA...`",
        )
    line = f"on; {settings.allowed_signers} has {len(principals)} signer(s), admins {', '.join(settings.admins)}"
    if settings.forge_signers:
        how = f"squash/rebase against {settings.forge_pull_refs}" if settings.forge_pull_refs else "merge commits only"
        line += f"; forges {', '.join(settings.forge_signers)} ({how})"
    return line


def check_gpus(settings: Settings) -> str:
    try:
        nodes = _alive_nodes(_dashboard(settings))
    except ArgusError as exc:
        raise CheckFailed(str(exc), "check the Ray head's dashboard") from exc
    parts: list[str] = []
    slots_total = gpus_total = 0.0
    for node in nodes:
        total = node.get("resources_total")
        res: dict[str, Any] = total if isinstance(total, dict) else {}
        gpus, slots = float(res.get("GPU", 0) or 0), float(res.get("worker_node", 0) or 0)
        real = any(isinstance(k, str) and k.startswith("accelerator_type:") for k in res)
        name = str(node.get("node_name") or node.get("node_ip") or "?")
        role = "head" if node.get("is_head_node") else "worker"
        kind = "real" if real else "logical" if gpus else "no"
        parts.append(f"{name} ({role}) {gpus:g} {kind} GPU, {slots:g} worker_node")
        slots_total += slots
        gpus_total += gpus
    summary = "; ".join(parts) or "no nodes"
    if slots_total == 0:
        raise CheckFailed(
            f"no node offers worker_node slots: no training task can start ({summary})",
            "start the workers with argus-node worker (ARGUS_WORKER_GPUS) or set ARGUS_WORKER_RESOURCES",
        )
    return f"{gpus_total:g} GPU, {slots_total:g} driver slots: {summary}"


def check_api_keys(settings: Settings) -> str:
    if not settings.api_keys:
        raise CheckWarned(
            "none configured: the OpenAI endpoint is open, anyone who reaches it can call every model",
            "set ARGUS_API_KEYS (docs/admins/api-keys.md)",
        )
    cluster = _cluster(settings)
    files = KeysFiles(settings.api_keys)
    keys = files.read()
    problems = files.problems
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise CheckFailed(
            "; ".join(str(p) for p in problems[:5]) + more, "fix or delete those lines (docs/admins/api-keys.md)"
        )
    parts = []
    for file in files.files:
        mine = file.read()
        parts.append(
            f"{file.path} absent"
            if file.absent
            else f"{file.path}: {len(mine)} key(s) of {len(set(mine.values()))} user(s)"
        )
    known = known_users(keys, cluster.users)
    ignored = sorted(set(keys.values()) - set(known.values()))
    tail = f"; ignored, not users of cluster.yaml: {', '.join(ignored)}" if ignored else ""
    return f"closed, {len(known)} key(s) of {len(set(known.values()))} user(s): {'; '.join(parts)}{tail}"


def _users(settings: Settings, cluster: ClusterSpec) -> list[str]:
    names = set(cluster.users or {})
    if settings.keys_dir and os.path.isdir(settings.keys_dir):
        names |= {f[: -len(".pub")] for f in os.listdir(settings.keys_dir) if f.endswith(".pub")}
    return sorted(names)


def check_users_root(settings: Settings) -> str:
    cluster = _cluster(settings)
    root = cluster.paths.users
    try:
        info = os.stat(root)
    except OSError as exc:
        raise CheckFailed(f"{root}: {exc.strerror}", "run images/first-run and mount the shared folder") from exc
    if not stat.S_ISDIR(info.st_mode) or not _may(info, JOB_UID, 0o1):
        raise CheckFailed(f"{root} cannot be entered by uid {JOB_UID}", "run images/first-run (users/ root 0711)")
    users = _users(settings, cluster)
    bad, missing = [], []
    for user in users:
        try:
            home = os.lstat(posixpath.join(root, user))
        except OSError:
            missing.append(user)
            continue
        if not stat.S_ISDIR(home.st_mode) or not _may(home, JOB_UID, 0o3):
            bad.append(f"{user} (uid {home.st_uid}, mode {home.st_mode & 0o7777:o})")
    if bad or missing:
        what = "; ".join(
            ([f"not writable by uid {JOB_UID}: {', '.join(bad)}"] if bad else [])
            + ([f"no home yet: {', '.join(missing)}"] if missing else [])
        )
        raise CheckFailed(
            f"{root}: {what}", "the file service makes each home from keys/<user>.pub: docker compose logs files"
        )
    return f"{root}: {len(users)} home(s) writable by uid {JOB_UID}"


def _may(info: os.stat_result, uid: int, bits: int) -> bool:
    """Whether ``uid`` (its group = its uid, as in the images) has ``bits`` (rwx as 0o4/2/1) on ``info``."""
    if uid == 0:
        return True
    mode = info.st_mode
    if info.st_uid == uid:
        return (mode >> 6) & bits == bits
    if info.st_gid == uid:
        return (mode >> 3) & bits == bits
    return mode & bits == bits


CHECKS: tuple[tuple[str, Callable[[Settings], str]], ...] = (
    ("ray dashboard", check_dashboard),
    ("jobs api", check_jobs),
    ("serve", check_serve),
    ("openai endpoint", check_openai),
    ("config repository", check_repository),
    ("status branch", check_status_branch),
    ("daemon /healthz", check_healthz),
    ("state folder", check_state_folder),
    ("ownership", check_ownership_key),
    ("signing", check_signing),
    ("api keys", check_api_keys),
    ("gpus and driver slots", check_gpus),
    ("users' homes", check_users_root),
)


def run_checks(
    settings: Settings, checks: Sequence[tuple[str, Callable[[Settings], str]]] | None = None
) -> list[Result]:
    """Run every check at once, each in a daemon thread given ``settings.timeout`` (plus a second);
    returns their results in ``checks``' order. Never raises: an unexpected error is that check's FAIL."""
    checks = CHECKS if checks is None else checks
    results: dict[str, Result] = {}

    def one(name: str, check: Callable[[Settings], str]) -> None:
        try:
            results[name] = Result(name, True, check(settings))
        except CheckWarned as exc:
            results[name] = Result(name, True, str(exc), exc.fix, warning=True)
        except CheckFailed as exc:
            results[name] = Result(name, False, str(exc), exc.fix)
        except Exception as exc:  # a probe's own bug must not hide the other checks
            results[name] = Result(name, False, f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=c, daemon=True, name=f"doctor {c[0]}") for c in checks]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + settings.timeout + 1
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    return [
        results.get(name)
        or Result(name, False, f"no answer within {settings.timeout:.0f}s", "that component is wedged")
        for name, _ in checks
    ]
