"""``argus validate``, ``argus plan`` and ``argus render``: the checks a config repository's pull
request runs, on a plain directory (no daemon, no Ray; the base install)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from reconciler.cli._shared import _raw_arg
from reconciler.errors import ArgusError, Issue
from reconciler.plan import render
from reconciler.plan.actions import ActionType
from reconciler.plan.actual import ActualState, NodeCapacity
from reconciler.plan.admission import unschedulable
from reconciler.plan.planner import plan as make_plan
from reconciler.source.directory import created_times, read_directory
from reconciler.source.localfs import LocalFS
from reconciler.spec.loader import ModelCheck, TaskCheck, load
from reconciler.spec.paths import FileSystem
from reconciler.spec.types import DesiredState


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


def add_parsers(sub: Any) -> None:
    """Register ``validate``, ``plan`` and ``render`` on ``sub`` (argparse's subparsers)."""
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
