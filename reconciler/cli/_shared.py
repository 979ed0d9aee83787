"""What several ``argus`` commands share: the ARGUS_* environment defaults, the argument groups and
types used by more than one command, the signing policy and daemon parts built from them, and the check
that the runtime extras are installed."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from typing import Any

from reconciler.dashboard import Dashboard
from reconciler.errors import ArgusError, ConfigError, MissingExtra
from reconciler.source.signatures import SigningPolicy

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
        help="Ray Serve's own HTTP proxy, where models are asked for one real answer before they count as "
        "RUNNING and where the OpenAI endpoint forwards (default auto: the dashboard's host at cluster.yaml's "
        "serving.internal_http_port; off: trust Serve's status, the endpoint still uses auto's) [ARGUS_SERVE_URL]",
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
        endpoint_listen=_openai_listen(args),
        endpoint_link=getattr(args, "endpoint_link", None) or None,
    )


def _openai_listen(args: argparse.Namespace) -> str | None:
    """``argus run --openai-listen``: None for ``off`` (and for commands without the flag)."""
    listen = getattr(args, "openai_listen", None)
    if listen in (None, "", "off"):
        return None
    _host, sep, port = str(listen).rpartition(":")
    if listen != "auto" and not (sep and port.isdigit() and 0 < int(port) < 65536):
        raise ArgusError(f"--openai-listen: not auto, off or HOST:PORT: {listen!r}")
    return str(listen)
