"""The ``argus`` command line. Results go to stdout, errors to stderr.

Exit codes: ``validate`` 0 valid / 1 errors; ``plan`` 0 no changes / 2 changes pending /
1 errors (terraform's ``-detailed-exitcode``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from reconciler import __version__
from reconciler.errors import ArgusError, Issue
from reconciler.plan import render
from reconciler.plan.actual import ActualState
from reconciler.plan.planner import plan as make_plan
from reconciler.source.directory import created_times, read_directory
from reconciler.source.localfs import LocalFS
from reconciler.spec.loader import TaskCheck, load
from reconciler.spec.paths import FileSystem
from reconciler.spec.types import DesiredState

EPILOG = """\
exit codes:
  validate  0 valid, 1 errors
  plan      0 no changes, 2 changes pending, 1 errors

examples:
  argus validate .                       check a config repository (all errors, as path:line)
  argus validate . --offline             skip checks that need the cluster's file system
  argus plan . --actual actual.json --format markdown   preview a pull request
"""


def _task_check() -> TaskCheck | None:
    """verl's own config check, when verl is installed (it is not in the base install)."""
    try:
        from reconciler.checks.verl_overrides import check_overrides, verl_available
    except ImportError:
        return None
    return check_overrides if verl_available() else None


def load_dir(directory: str, offline: bool, *, quiet: bool = False) -> DesiredState:
    """Load a plain directory. Online checks run only when the cluster's roots exist here."""
    if not os.path.isdir(directory):
        raise ArgusError(f"{directory}: not a directory")
    files = read_directory(directory)
    created, now = created_times(directory)
    fs: FileSystem | None = None if offline else LocalFS()
    state = load(files, created=created, default_time=now, fs=fs, task_check=_task_check())
    if fs is not None:
        roots = [state.cluster.paths.common, state.cluster.paths.users]
        missing = [r for r in roots if not os.path.isdir(r)]
        if missing:
            if not quiet:
                print(
                    f"note: {', '.join(missing)} not found on this machine: checks that need the cluster's file "
                    "system were skipped (as with --offline)",
                    file=sys.stderr,
                )
            state = load(files, created=created, default_time=now, fs=None, task_check=_task_check())
    return state


def cmd_validate(args: argparse.Namespace) -> int:
    state = load_dir(args.dir, args.offline, quiet=args.format == "json")
    if args.format == "json":
        print(json.dumps({"errors": [i.to_json() for i in state.issues], "objects": state.object_count}, indent=2))
    else:
        for issue in state.issues:
            print(issue, file=sys.stderr)
        if state.issues:
            print(f"{len(state.issues)} error(s); {state.object_count} valid object(s)", file=sys.stderr)
        else:
            print(f"ok: {state.object_count} object(s) valid")
    return 1 if state.issues else 0


def cmd_plan(args: argparse.Namespace) -> int:
    state = load_dir(args.dir, args.offline, quiet=args.format == "json")
    state.approve_prune = state.approve_prune or args.approve_prune
    actual = ActualState()
    if args.actual:
        try:
            with open(args.actual, encoding="utf-8") as fh:
                actual = ActualState.from_json(json.load(fh))
        except (OSError, ValueError) as exc:
            raise ArgusError(f"{args.actual}: cannot read the actual state: {exc}") from exc
    result = make_plan(state, actual)
    issues: list[Issue] = state.issues
    if args.format == "json":
        print(json.dumps({**result.to_json(), "errors": [i.to_json() for i in issues]}, indent=2))
    elif args.format == "markdown":
        print(render.markdown(result, issues))
    else:
        sys.stdout.write(render.text(result, []))
        for issue in issues:
            print(issue, file=sys.stderr)
    if issues:
        return 1
    return 2 if result.has_changes else 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="argus",
        description="GitOps for Ray clusters: users' YAML in git -> Ray Jobs (training) and Ray Serve LLM (models).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"argus {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    v = sub.add_parser("validate", help="check a config repository; print every error as path:line: message",
                       description="Check cluster.yaml and users/<user>/{models,tasks}/*.yaml against the schemas and "
                       "the path policy. Exit 0 when valid, 1 when not.")
    v.add_argument("dir", nargs="?", default=".", metavar="DIR", help="config repository folder (default: .)")
    v.add_argument("--offline", action="store_true", help="skip checks that need the cluster's file system "
                   "(path existence, symlinks, Hugging Face cache)")
    v.add_argument("--format", choices=["text", "json"], default="text",
                   help='text: one "path:line: message" per error; json: {"errors": [...], "objects": N}')
    v.set_defaults(func=cmd_validate)

    p = sub.add_parser("plan", help="show what applying DIR would do (exit 0 none, 2 changes, 1 errors)",
                       description="Plan the actions that would make the cluster match DIR, against an actual state "
                       "(JSON, as `argus status --format actual` or the daemon's status branch publish it).")
    p.add_argument("dir", nargs="?", default=".", metavar="DIR", help="config repository folder (default: .)")
    p.add_argument("--actual", metavar="FILE.json", help="actual state (default: an empty cluster)")
    p.add_argument("--format", choices=["text", "json", "markdown"], default="text",
                   help="markdown is ready to paste into a pull-request comment")
    p.add_argument("--offline", action="store_true", help="skip checks that need the cluster's file system")
    p.add_argument("--approve-prune", action="store_true",
                   help="plan as if the head commit carried the `Argus-Approve-Prune: yes` trailer")
    p.set_defaults(func=cmd_plan)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except ArgusError as exc:
        print(f"argus: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
