"""The ``argus`` command line. Results go to stdout, errors to stderr.

Exit codes: ``validate`` 0 valid / 1 errors; ``plan`` 0 no changes / 2 changes pending /
1 errors (terraform's ``-detailed-exitcode``).

The commands live in one module per group (checks, daemon, reading, admin, usage; what they share in
``_shared``); this module builds the parser from them and runs the command. The names below are
re-exported: ``from reconciler.cli import main, load_dir, ...`` keeps working.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from reconciler.cli import admin, checks, daemon, reading
from reconciler.cli._shared import (
    DEFAULT_MAX_BODY,
    EXTRA_HINT,
    RUNTIME_MODULES,
    _api_keys,
    _env,
    _host_list,
    _missing_extra,
    _names,
    _parts,
    _positive_int,
    _raw_arg,
    _require_runtime,
    _signing,
    _source_args,
    _status_branch_name,
)
from reconciler.cli.admin import cmd_backup, cmd_demo, cmd_doctor, cmd_init, cmd_restore
from reconciler.cli.checks import (
    CHECK_EXTRA,
    NEVER_CHECKED,
    SQUASH_NOTE,
    _model_check,
    _task_check,
    cmd_plan,
    cmd_render,
    cmd_validate,
    load_dir,
    never_runs,
    skipped_checks,
)
from reconciler.cli.daemon import _attach_log_tails, _daemon_pages, _states_table, cmd_reconcile, cmd_run
from reconciler.cli.reading import cmd_logs, cmd_status
from reconciler.errors import ArgusError
from reconciler.redact import redact
from reconciler.terminal import guard as terminal_guard

__all__ = [
    "CHECK_EXTRA",
    "DEFAULT_MAX_BODY",
    "EPILOG",
    "EXTRA_HINT",
    "NEVER_CHECKED",
    "RUNTIME_MODULES",
    "SQUASH_NOTE",
    "TERMINAL_GUARDED",
    "_api_keys",
    "_attach_log_tails",
    "_daemon_pages",
    "_env",
    "_host_list",
    "_missing_extra",
    "_model_check",
    "_names",
    "_parts",
    "_positive_int",
    "_raw_arg",
    "_require_runtime",
    "_signing",
    "_source_args",
    "_states_table",
    "_status_branch_name",
    "_task_check",
    "build_parser",
    "cmd_backup",
    "cmd_demo",
    "cmd_doctor",
    "cmd_init",
    "cmd_logs",
    "cmd_plan",
    "cmd_reconcile",
    "cmd_render",
    "cmd_restore",
    "cmd_run",
    "cmd_status",
    "cmd_validate",
    "load_dir",
    "main",
    "never_runs",
    "skipped_checks",
]

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

    checks.add_parsers(sub)
    daemon.add_parsers(sub)
    reading.add_parsers(sub)
    admin.add_parsers(sub)

    from reconciler.cli.usage import add_parser as add_usage_parser

    add_usage_parser(sub, _env)
    return parser


# Commands that print what users, jobs and the cluster wrote: on a terminal their control
# characters are shown escaped (reconciler.terminal), unless --raw.
TERMINAL_GUARDED = frozenset({"status", "logs", "plan", "usage"})


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
