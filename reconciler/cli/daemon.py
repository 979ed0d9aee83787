"""``argus reconcile`` (one tick) and ``argus run`` (the daemon): the commands that act on the cluster.
They import the daemon's modules inside the commands: the base install has no runtime extras."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from reconciler.cli._shared import (
    DEFAULT_MAX_BODY,
    RUNTIME_MODULES,
    _env,
    _host_list,
    _parts,
    _positive_int,
    _require_runtime,
    _signing,
    _source_args,
    _status_branch_name,
)
from reconciler.dashboard import Dashboard
from reconciler.errors import ArgusError
from reconciler.plan import render
from reconciler.redact import redact_url
from reconciler.source.remote import open_source

if TYPE_CHECKING:
    from reconciler.tick import TickResult
    from reconciler.web.response import PageHandler


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
        serving=lambda: parts.observer.serving_dash,
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
        serve_watch=args.serve_watch_interval,
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
        if parts.endpoint is not None:
            parts.endpoint.start_link()  # the OpenAI endpoint itself starts at the first tick (its port)
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
                "openai_listen": args.openai_listen,
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


def cmd_endpoint(args: argparse.Namespace) -> int:
    """``argus endpoint``: serve until SIGTERM/SIGINT. Exit 1 when the address cannot be bound."""
    import asyncio
    import logging
    import signal

    from reconciler.endpoint.hub import parse_listen
    from reconciler.endpoint.link import LinkClient
    from reconciler.endpoint.server import Endpoint
    from reconciler.endpoint.service import new_loop, start_site
    from reconciler.redact import RedactingFormatter

    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    for handler in logging.getLogger().handlers:
        handler.setFormatter(RedactingFormatter())
    try:
        host, port = parse_listen(args.listen, 0)
    except ValueError as exc:
        raise ArgusError(f"--listen: {exc}") from exc
    link = LinkClient(args.endpoint_link)
    endpoint = Endpoint(args.serve_url, link.sync)

    async def main() -> None:
        try:
            runner = await start_site(endpoint, host, port)
        except OSError as exc:
            raise ArgusError(f"cannot listen on {host}:{port}: {exc}") from exc
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopping.set)
        follow = asyncio.ensure_future(link.follow(endpoint))
        print(json.dumps({"event": "endpoint_started", "listen": f"{host}:{port}"}), file=sys.stderr, flush=True)
        try:
            await stopping.wait()
        finally:
            follow.cancel()
            await runner.cleanup()
            await link.close()

    with asyncio.Runner(loop_factory=new_loop) as runner:
        runner.run(main())
    return 0


def add_parsers(sub: Any) -> None:
    """Register ``reconcile``, ``run`` and ``endpoint`` on ``sub`` (argparse's subparsers)."""
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
        "--openai-listen",
        default=_env("OPENAI_LISTEN", "auto"),
        metavar="auto|HOST:PORT|off",
        help="where this process serves the OpenAI endpoint (API keys, access rules, limits, usage; requests "
        "go on to Ray Serve's proxy without any caller's key): auto (default) is 0.0.0.0 at cluster.yaml's "
        "serving.http_port; off when `argus endpoint` processes serve it through --endpoint-link "
        "[ARGUS_OPENAI_LISTEN]",
    )
    d.add_argument(
        "--endpoint-link",
        default=_env("ENDPOINT_LINK"),
        metavar="SOCKET",
        help="a Unix socket on which `argus endpoint` processes take the gate config (keys' hashes, access "
        "rules, limits) and share this daemon's rate windows; put it where only they and the daemon can reach "
        "(compose: the argus-link volume) [ARGUS_ENDPOINT_LINK]",
    )
    d.add_argument(
        "--observe-interval",
        type=float,
        default=float(_env("OBSERVE_INTERVAL", "5") or 5),
        help="seconds between observations of Ray (default: 5) [ARGUS_OBSERVE_INTERVAL]",
    )
    d.add_argument(
        "--serve-watch-interval",
        type=float,
        default=float(_env("SERVE_WATCH_INTERVAL", "1") or 1),
        help="seconds between reads of Serve's application list between ticks: a job's shadow application "
        "or a take-over of argus's wakes a tick at once, so it lives about this long plus a tick (default: 1; "
        "0: only the ticks look) [ARGUS_SERVE_WATCH_INTERVAL]",
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
        help="seconds between reads of the endpoint's usage meter, and so between usage documents' "
        "updates (default: 60) [ARGUS_USAGE_INTERVAL]",
    )
    d.set_defaults(func=cmd_run)

    e = sub.add_parser(
        "endpoint",
        help="the OpenAI endpoint as a process of its own (the compose service), beside `argus run`",
        description="Serve the OpenAI API: check each request's API key, the model's access rules and the "
        "caller's rate limits, count usage, and forward the request to Ray Serve's own proxy without any "
        "caller's key. The gate config and the shared rate windows come from the daemon over its private "
        "link (`argus run --endpoint-link`); several endpoint processes may run.",
    )
    e.add_argument(
        "--listen",
        default=_env("OPENAI_LISTEN", "0.0.0.0:8000"),
        metavar="HOST:PORT",
        help="address to serve on (default: 0.0.0.0:8000) [ARGUS_OPENAI_LISTEN]",
    )
    e.add_argument(
        "--endpoint-link",
        default=_env("ENDPOINT_LINK"),
        required=_env("ENDPOINT_LINK") is None,
        metavar="SOCKET",
        help="the daemon's private link (its --endpoint-link) [ARGUS_ENDPOINT_LINK]",
    )
    e.add_argument(
        "--serve-url",
        default=_env("SERVE_URL"),
        required=_env("SERVE_URL") is None,
        metavar="URL",
        help="Ray Serve's own HTTP proxy, on the cluster's internal network (e.g. http://head:8001) [ARGUS_SERVE_URL]",
    )
    e.set_defaults(func=cmd_endpoint)
