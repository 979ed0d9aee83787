"""Status documents: one YAML file per object and a README table. Pure.

Nothing here changes between two ticks unless the object changed, so an idle daemon makes
no commits: times recorded are transition times, never "now".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from reconciler.plan.actual import FINAL_JOB_STATES
from reconciler.plan.assess import ObjectStatus
from reconciler.spec.types import ObjectKey

MAX_EVENTS = 20


def status_path(st: ObjectStatus) -> str:
    return st.key.path


def object_document(
    st: ObjectStatus,
    previous: Mapping[str, Any] | None,
    *,
    revision: str | None,
    applied: bool,
    now: str,
    endpoint: str,
    log_tails: Mapping[str, list[str]],
    checkpoints: Mapping[str, str | None],
) -> dict[str, Any]:
    """Return the status document of one object, carrying history over from ``previous``.

    ``applied``: the object matches (or was just made to match) ``revision``; then it becomes
    ``last_applied``. ``now`` is used only when the state changes.
    """
    prev = dict(previous or {})
    events = list(prev.get("events", []))
    changed = (prev.get("state"), prev.get("sync"), prev.get("reason", "")) != (st.state, st.sync, st.reason)
    last_transition = prev.get("last_transition")
    if changed or last_transition is None:
        last_transition = now
        events.append({"time": now, "state": st.state, "sync": st.sync, "reason": st.reason})
    revisions = dict(prev.get("revision", {}))
    if revision:
        revisions["last_attempted"] = revision
        if applied:
            revisions["last_applied"] = revision
    doc: dict[str, Any] = {
        "object": str(st.key),
        "kind": "Model" if st.key.kind == "model" else "Task",
        "state": st.state,
        "sync": st.sync,
        "reason": st.reason,
    }
    if st.key.kind == "model":
        doc["served_name"] = st.served_name
        doc["endpoint"] = endpoint
        doc["replicas"] = {"desired": st.replicas_desired, "ready": st.replicas_ready}
    else:
        doc["submission_id"] = st.submission_id
    doc["gpus"] = st.gpus
    doc["revision"] = revisions
    doc["last_transition"] = last_transition
    first_seen = prev.get("first_seen") or (_iso(st.first_seen) if st.first_seen is not None else None)
    if first_seen:  # recorded once, never changed: the first-come-first-served order survives restarts
        doc["first_seen"] = first_seen
    if st.key.kind == "task":
        # The runs are the durable record of what ran (reconciler/observe/runs.py): a run Ray
        # forgot keeps what was recorded about it (times, log tail) from the previous document.
        before = {r.get("submission_id"): r for r in prev.get("runs") or [] if isinstance(r, dict)}
        doc["runs"] = [
            _keep(
                _run(j.submission_id, j.status, j.message, j.start_time, j.end_time, log_tails, checkpoints)
                | {"spec_hash": j.spec_hash},
                before.get(j.submission_id),
            )
            for j in st.runs
        ]
    doc["events"] = events[-MAX_EVENTS:]
    return doc


def _run(
    sid: str,
    status: str,
    message: str,
    start: int | None,
    end: int | None,
    log_tails: Mapping[str, list[str]],
    checkpoints: Mapping[str, str | None],
) -> dict[str, Any]:
    run: dict[str, Any] = {"submission_id": sid, "status": status, "start_time": _ms(start), "end_time": _ms(end)}
    if message:
        run["message"] = message
    if checkpoints.get(sid):
        run["checkpoint"] = checkpoints[sid]
    # Only finished runs keep a log tail: a live tail would make a commit every tick.
    if status in FINAL_JOB_STATES and log_tails.get(sid):
        run["log_tail"] = log_tails[sid]
    return run


def _keep(run: dict[str, Any], recorded: Mapping[str, Any] | None) -> dict[str, Any]:
    """``run`` with what ``recorded`` (the same run's previous entry) knew and ``run`` does not."""
    if not recorded:
        return run
    for field in ("start_time", "end_time", "message", "checkpoint", "log_tail"):
        if run.get(field) in (None, "") and recorded.get(field) not in (None, ""):
            run[field] = recorded[field]
    ordered = {k: run[k] for k in _RUN_ORDER if k in run}  # recorded fields in their usual place
    ordered.update(run)
    return ordered


_RUN_ORDER = ["submission_id", "status", "start_time", "end_time", "message", "checkpoint", "log_tail", "spec_hash"]


def _ms(value: int | None) -> str | None:
    if not value:
        return None
    import datetime as _dt

    return _dt.datetime.fromtimestamp(value / 1000, tz=_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _iso(epoch: int) -> str:
    import datetime as _dt

    return _dt.datetime.fromtimestamp(epoch, tz=_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def first_seen_of(docs: Mapping[str, Mapping[str, Any]]) -> dict[ObjectKey, int]:
    """The recorded ``first_seen`` of every status document (path -> document) that has a
    readable one, as UTC epoch seconds; documents without one are left out."""
    import datetime as _dt

    out: dict[ObjectKey, int] = {}
    for doc in docs.values():
        try:
            key = ObjectKey.parse(str(doc.get("object")))
            when = _dt.datetime.strptime(str(doc["first_seen"]), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=_dt.UTC)
        except (KeyError, ValueError):
            continue
        out[key] = int(when.timestamp())
    return out


def dump(doc: Mapping[str, Any]) -> bytes:
    text: str = yaml.safe_dump(dict(doc), sort_keys=False, allow_unicode=True, width=1000)
    return text.encode()


def readme(docs: Mapping[str, Mapping[str, Any]], *, revision: str | None, errors: list[str]) -> bytes:
    """The status branch's README.md: a markdown table of every object."""
    lines = [
        "# argus status",
        "",
        "Written by the argus daemon; do not edit. "
        "One file per object mirrors `users/<user>/{models,tasks}/<name>.yaml`.",
        "",
        f"Desired revision: `{revision or 'unknown'}`",
        "",
        "| user | kind | name | state | sync | endpoint / job | updated |",
        "|---|---|---|---|---|---|---|",
    ]
    for path in sorted(docs):
        d = docs[path]
        user, kinds, name = path.split("/")[1], path.split("/")[2], path.split("/")[3].removesuffix(".yaml")
        where = f"`{d.get('served_name')}`" if kinds == "models" else f"`{d.get('submission_id') or '-'}`"
        cells = [user, kinds[:-1], name, d.get("state"), d.get("sync"), where, d.get("last_transition")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    if errors:
        lines += ["", "## Validation errors at this revision", ""] + [f"- `{e}`" for e in errors]
    return ("\n".join(lines) + "\n").encode()
