"""``argus usage``: requests, tokens and GPU-seconds per user and object, read from the status
branch's usage documents (docs/design/usage.md) the way ``argus status`` reads the branch.

The table sums every row of the documents of the dates asked for (UTC, inclusive): token rows
over their meter epochs and hours, GPU-second rows over their hours and runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from reconciler.errors import ArgusError
from reconciler.redact import redact_url
from reconciler.status.usage import USAGE_DIR, Day, is_usage_path, parse_document

_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")
COLUMNS = ("USER", "OBJECT", "REQUESTS", "PROMPT_TOKENS", "COMPLETION_TOKENS", "GPU_SECONDS")


@dataclass
class Row:
    """One (user, object) line of the table."""

    requests: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    gpu_seconds: float = 0.0

    def add(self, other: Row) -> None:
        self.requests += other.requests
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.gpu_seconds += other.gpu_seconds

    def to_json(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "gpu_seconds": round(self.gpu_seconds, 3),
        }


def summarise(
    days: Iterable[tuple[str, Day]], user: str | None = None, since: str | None = None, until: str | None = None
) -> dict[tuple[str, str], Row]:
    """(user, object) -> summed row over the ``days`` whose date is within ``[since, until]``
    (either may be None: unbounded), only ``user``'s when given. Pure."""
    out: dict[tuple[str, str], Row] = {}
    for date, day in days:
        if (since and date < since) or (until and date > until):
            continue
        for (_epoch, _hour, u, model), (req, prompt, completion) in day.tokens.items():
            if user is None or u == user:
                out.setdefault((u, model), Row()).add(Row(req, prompt, completion))
        for (_hour, u, _team, _kind, obj, _run), seconds in day.gpu.items():
            if user is None or u == user:
                out.setdefault((u, obj), Row()).add(Row(gpu_seconds=seconds))
    return out


def render(table: Mapping[tuple[str, str], Row]) -> list[str]:
    """The text table: one line per (user, object), then each user's total. Pure."""
    lines: list[tuple[str, ...]] = [COLUMNS]
    totals: dict[str, Row] = {}
    for (user, obj), row in sorted(table.items()):
        lines.append(_cells(user, obj, row))
        totals.setdefault(user, Row()).add(row)
    for user, row in sorted(totals.items()):
        lines.append(_cells(user, "(total)", row))
    widths = [max(len(line[i]) for line in lines) for i in range(len(COLUMNS))]
    return [
        "  ".join(c.ljust(widths[i]) if i < 2 else c.rjust(widths[i]) for i, c in enumerate(line)).rstrip()
        for line in lines
    ]


def _cells(user: str, obj: str, row: Row) -> tuple[str, ...]:
    return (
        user,
        obj,
        str(row.requests),
        str(row.prompt_tokens),
        str(row.completion_tokens),
        f"{row.gpu_seconds:.1f}",
    )


def read_days(files: Mapping[str, Any]) -> list[tuple[str, Day]]:
    """The parsed usage documents among the status branch's ``files`` (path -> parsed JSON); a
    file that is not a usage document of its own date is skipped."""
    out = []
    for path, value in sorted(files.items()):
        parsed = parse_document(value) if is_usage_path(path) else None
        if parsed is not None and path == f"{USAGE_DIR}{parsed[0]}.json":
            out.append(parsed)
    return out


def _date(text: str) -> str:
    if not _DATE.match(text):
        raise argparse.ArgumentTypeError(f"{text!r} is not a date YYYY-MM-DD")
    return text


def cmd_usage(args: argparse.Namespace) -> int:
    """Print the usage table (or JSON). Returns the exit status: 1 when the data may be stale.
    Raises ArgusError when there is no status branch."""
    from reconciler.status.store import StatusStore
    from reconciler.web.text import fetch_status_source

    source, stale, remote = fetch_status_source(args.repo, args.cache_dir, args.status_branch, args.remote)
    if stale:
        print(f"argus: warning: {stale}; showing the last copy fetched, which may be stale", file=sys.stderr)
    store = StatusStore(source.repo.path, args.status_branch, remote_too=remote or True)  # one-off: read once
    head = store.tip()
    if head is None:
        origin = f" on remote {remote!r}" if remote else ""
        raise ArgusError(
            f"no status branch {args.status_branch!r}{origin} in {redact_url(args.repo)}: is the daemon running, and "
            "writing to this remote? (--remote NAME picks another; --status-branch another branch)"
        )
    table = summarise(read_days(store.files_under(USAGE_DIR, head)), args.user, args.since, args.until)
    if args.json:
        users: dict[str, Row] = {}
        for (user, _obj), row in table.items():
            users.setdefault(user, Row()).add(row)
        out = {
            "since": args.since,
            "until": args.until,
            "rows": [{"user": u, "object": o, **r.to_json()} for (u, o), r in sorted(table.items())],
            "totals": {u: r.to_json() for u, r in sorted(users.items())},
        }
        print(json.dumps(out, indent=2))
        return 1 if stale else 0
    for line in render(table):
        print(line)
    if not table:
        print("(no usage recorded for this selection)", file=sys.stderr)
    return 1 if stale else 0


def add_parser(sub: Any, env: Any) -> None:
    """Register ``argus usage`` on ``sub`` (argparse's subparsers); ``env(name, default)`` reads
    ``ARGUS_<name>``."""
    u = sub.add_parser(
        "usage",
        help="print requests, tokens and GPU-seconds per user and object",
        description="Read the usage documents the daemon writes on the status branch and print them as a table: "
        "requests and tokens per model (from the router's meter), GPU-seconds per task and model, and each "
        "user's total. Dates are UTC days, inclusive.",
    )
    u.add_argument("--user", help="only this user's rows")
    u.add_argument("--since", type=_date, metavar="YYYY-MM-DD", help="first UTC day (default: the first recorded)")
    u.add_argument("--until", type=_date, metavar="YYYY-MM-DD", help="last UTC day (default: the last recorded)")
    u.add_argument("--json", action="store_true", help="machine-readable output")
    u.add_argument("--repo", default=env("REPO", "."), help="config repository (default: .) [ARGUS_REPO]")
    u.add_argument("--status-branch", default=env("STATUS_BRANCH", "argus/status"))
    u.add_argument("--remote", metavar="NAME", help="the remote of a clone the status branch is fetched from")
    u.add_argument("--cache-dir", default=env("CACHE_DIR", os.path.expanduser("~/.cache/argus")))
    u.set_defaults(func=cmd_usage)
