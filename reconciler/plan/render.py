"""Render a plan as text or markdown (for a pull-request comment). Pure."""

from __future__ import annotations

from collections import Counter

from reconciler.errors import Issue
from reconciler.plan.actions import ActionType, Plan

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
    if plan.has_changes:
        parts.append("Plan: " + ", ".join(f"{n} {name}" for name, n in sorted(counts.items())))
    elif not held:
        kept = f" ({counts['keep']} kept)" if counts["keep"] else ""
        parts.append(f"No changes: the cluster matches the repository.{kept}")
    return " ".join(parts)


def text(plan: Plan, issues: list[Issue]) -> str:
    lines = []
    for a in plan.actions:
        lines.append(f"{SYMBOL[a.type]} {a.type.value:<13} {a.key!s:<40} {a.reason}")
    for note in plan.notes:
        lines.append(f"! {note}")
    for issue in issues:
        lines.append(f"error: {issue}")
    lines.append(summary(plan))
    return "\n".join(lines) + "\n"


def markdown(plan: Plan, issues: list[Issue]) -> str:
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
    if issues:
        out += [
            f"**{len(issues)} validation error{'s' if len(issues) != 1 else ''}** "
            "(these objects are kept as they run):",
            "",
        ]
        out += [f"- `{i.where}` {i.message}" for i in issues]
        out.append("")
    return "\n".join(out)
