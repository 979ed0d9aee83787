"""Render a plan as text or markdown (for a pull-request comment). Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from reconciler.errors import Issue
from reconciler.plan.actions import ActionType, Plan
from reconciler.spec.types import DesiredState, ObjectKey

SYMBOL = {
    ActionType.DEPLOY_MODEL: "+",
    ActionType.SUBMIT_TASK: "+",
    ActionType.UPDATE_MODEL: "~",
    ActionType.SCALE_MODEL: "~",
    ActionType.DELETE_MODEL: "-",
    ActionType.STOP_MODEL: "-",
    ActionType.STOP_TASK: "-",
    ActionType.QUEUE: "…",
    ActionType.UNSCHEDULABLE: "!",
    ActionType.KEEP: "=",
}
MAX_NAMED = 10  # objects named in a headline; more are counted


def summary(plan: Plan) -> str:
    """The plan's headline: what will happen, never "no changes" when something is held back."""
    counts = Counter(a.type.value for a in plan.actions)
    if plan.frozen:
        return "Nothing will be applied: cluster.yaml is invalid; every object is kept as it runs until it is fixed."
    parts = []
    held = plan.held
    if held:
        names = ", ".join(str(a.key) for a in held[:MAX_NAMED])
        more = f" and {len(held) - MAX_NAMED} more" if len(held) > MAX_NAMED else ""
        parts.append(
            f"Deletions held by the mass-deletion guard: {names}{more} will not be deleted until a commit approves it."
        )
    stopped = plan.preemptions
    if stopped:
        named = ", ".join(f"{a.key} (for {a.preempted_by}, {a.preemption})" for a in stopped[:MAX_NAMED])
        more = f" and {len(stopped) - MAX_NAMED} more" if len(stopped) > MAX_NAMED else ""
        parts.append(f"Preempts: {named}{more}.")
    if plan.has_changes:
        parts.append("Plan: " + ", ".join(f"{n} {name}" for name, n in sorted(counts.items())))
    elif not held:
        kept = f" ({counts['keep']} kept)" if counts["keep"] else ""
        parts.append(f"No changes: the cluster matches the repository.{kept}")
    return " ".join(parts)


def text(plan: Plan, issues: list[Issue], desired: DesiredState | None = None) -> str:
    """The plan as text: one line per action; with ``desired``, a second line with the GPUs each
    object takes and the paths argus resolved for it."""
    lines = []
    for a in plan.actions:
        lines.append(f"{SYMBOL[a.type]} {a.type.value:<13} {a.key!s:<40} {a.reason}")
        detail = _detail(desired, a.key) if desired is not None and a.type not in _GONE else None
        if detail:
            lines.append(f"    {detail}")
    for note in plan.notes:
        lines.append(f"! {note}")
    for issue in issues:
        lines.append(f"error: {issue}")
    lines.extend(f"team {name}: {usage}" for name, usage in team_rows(plan))
    lines.append(summary(plan))
    return "\n".join(lines) + "\n"


def team_rows(plan: Plan) -> list[tuple[str, str]]:
    """(queue, "used … of nominal …, borrowed …, lent …, share …") per team once the plan is applied."""
    rows = []
    for name, team in sorted(plan.teams.items()):
        used, nominal, borrowed, lent = (fmt_quota(team, f) for f in ("used", "nominal", "borrowed", "lent"))
        usage = f"uses {used} of nominal {nominal}; borrowed {borrowed}; lent {lent}; "
        rows.append(
            (name or "(users in no team)", usage + f"fair share {team.get('share')} (weight {team.get('weight')})")
        )
    return rows


def fmt_quota(team: dict[str, object], field: str) -> str:
    values = team.get(field)
    items = values.items() if isinstance(values, dict) else ()
    shown = [f"{v:g} {'GPU' if k == 'gpus' else 'driver slots'}" for k, v in items if isinstance(v, float)]
    return ", ".join(shown) or "0"


# Actions after which the object takes nothing: no GPUs or paths to show.
_GONE = frozenset({ActionType.DELETE_MODEL, ActionType.STOP_MODEL, ActionType.STOP_TASK})


def _detail(desired: DesiredState, key: ObjectKey) -> str | None:
    """``2 GPU (2 replicas x 1) · source /private/...`` or ``1 GPU · model ... · data ...``; None when
    ``key`` is not a loaded object of ``desired``."""
    model = desired.models.get(key)
    if model is not None:
        source = model.source_path or (f"task:{model.source_task}'s newest checkpoint" if model.source_task else None)
        where = source or f"{model.source} (resolved on the cluster)"
        gpus = model.replicas * model.gpus_per_replica
        return f"{gpus} GPU ({model.replicas} replicas x {model.gpus_per_replica}) · source {where}"
    task = desired.tasks.get(key)
    if task is None:
        return None
    parts = [f"{task.gpus} GPU ({task.nodes} nodes x {task.gpus_per_node})"]
    if task.workload == "command":
        parts.append(f"working_dir {task.working_dir}" if task.working_dir else "command")
    else:
        parts.append(f"model {task.model_path or f'{task.model} (resolved on the cluster)'}")
        parts.append(f"data {', '.join(p for p in (task.data_train, task.data_val) if p)}")
    return " · ".join(parts)


def markdown(plan: Plan, issues: list[Issue], *, warnings: Sequence[str] = (), not_checked: Sequence[str] = ()) -> str:
    """The plan as a pull-request comment: actions, notes, every error, warnings, and what was not checked."""
    out = ["### argus plan", "", summary(plan), ""]
    if plan.actions:
        out += ["| | action | object | reason |", "|---|---|---|---|"]
        for a in plan.actions:
            reason = a.reason.replace("|", "\\|")
            out.append(f"| {SYMBOL[a.type]} | `{a.type.value}` | `{a.key}` | {reason} |")
        out.append("")
    for note in plan.notes:
        out.append(f"> **Note:** {note}")
        out.append("")
    rows = team_rows(plan)
    if rows:
        out += ["| team | quota once applied |", "|---|---|"]
        out += [f"| `{name}` | {usage} |" for name, usage in rows]
        out.append("")
    if issues:
        out += [
            f"**{len(issues)} validation error{'s' if len(issues) != 1 else ''}** "
            "(these objects are kept as they run):",
            "",
        ]
        out += [f"- `{i.where}` {i.message}" for i in issues]
        out.append("")
    if warnings:
        out += ["**Warnings:**", ""] + [f"- {w}" for w in warnings] + [""]
    if not_checked:
        out += ["**Not checked by this run:**", ""] + [f"- {n}" for n in not_checked] + [""]
    return "\n".join(out)
