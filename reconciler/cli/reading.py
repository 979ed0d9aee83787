"""``argus status`` and ``argus logs``: what users read back, from the status branch and through the
daemon."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from reconciler.cli._shared import _env, _raw_arg
from reconciler.errors import ArgusError
from reconciler.redact import redact_url


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


def add_parsers(sub: Any) -> None:
    """Register ``status`` and ``logs`` on ``sub`` (argparse's subparsers)."""
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
