"""Status documents: one YAML file per object, a README table and ``revision.yaml``. Pure.

Nothing in an object's document changes unless that object changed (its state, replicas,
runs, events or its own file), so an idle daemon makes no commits and a push that touches
one file changes one document: times recorded are transition times, never "now", and the
revision the daemon last attempted for the whole repository lives in ``revision.yaml`` and
the README only.
"""

from __future__ import annotations

import json
from bisect import bisect_left, insort
from collections.abc import Callable, Mapping
from typing import Any

import yaml

from reconciler.plan.actual import FINAL_JOB_STATES, ActualJob
from reconciler.plan.assess import ObjectStatus
from reconciler.redact import redact_tree
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
    spec_id: str | None = None,
    redact: Callable[[str], str] = str,
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Return the status document of one object, carrying history over from ``previous``.

    ``spec_id`` identifies the object's own file content (its git blob; None when it has no
    file): ``revision.last_attempted`` is the desired revision at which that content was
    first seen, ``revision.last_applied`` the one at which it was applied (``applied``: the
    object matches its file now). Neither moves on pushes that leave the object alone.
    ``now`` is used only when the state changes. Every text passes through ``redact``.
    """
    prev = dict(previous or {})
    reason = redact(st.reason)
    events = list(prev.get("events", []))
    changed = (prev.get("state"), prev.get("sync"), prev.get("reason", "")) != (st.state, st.sync, reason)
    last_transition = prev.get("last_transition")
    if changed or last_transition is None:
        last_transition = now
        events.append({"time": now, "state": st.state, "sync": st.sync, "reason": reason})
    revisions = dict(prev.get("revision", {}))
    if revision and spec_id is not None:
        if prev.get("spec_id") != spec_id or "last_attempted" not in revisions:
            revisions["last_attempted"] = revision
        if applied and revisions.get("applied_spec_id") != spec_id:
            revisions["last_applied"] = revision
            revisions["applied_spec_id"] = spec_id
    doc: dict[str, Any] = {
        "object": str(st.key),
        "kind": "Model" if st.key.kind == "model" else "Task",
        "state": st.state,
        "sync": st.sync,
        "reason": reason,
    }
    if st.key.kind == "model":
        doc["served_name"] = st.served_name
        doc["alias"] = st.alias
        doc["endpoint"] = endpoint
        doc["replicas"] = {"desired": st.replicas_desired, "ready": st.replicas_ready}
    else:
        doc["submission_id"] = st.submission_id
    doc["gpus"] = st.gpus
    doc["revision"] = revisions
    if spec_id is not None or "spec_id" in prev:
        doc["spec_id"] = spec_id if spec_id is not None else prev["spec_id"]
    doc["last_transition"] = last_transition
    if spec is not None:  # what argus derived from the file (reconciler.builders.resolved)
        doc["spec"] = redact_tree(spec, redact)
    elif "spec" in prev and st.state == "INVALID":
        doc["spec"] = prev["spec"]  # an invalid file keeps what runs: show what was derived for it
    # The admission order survives restarts; it moves only when the object's file changed
    # (the tick starts an edited request over), never on pushes that leave it alone. One the tick
    # did not place (an invalid file) keeps its recorded time only while its file is the same: an
    # edit starts it over here too, or a restarted daemon would seed the old place for the new file.
    kept = prev.get("first_seen") if doc.get("spec_id") == prev.get("spec_id") else None
    first_seen = _iso(st.first_seen) if st.first_seen is not None else kept
    if first_seen:
        doc["first_seen"] = first_seen
    # Which object it was preempted for, while it waits to resume (the planner never readmits
    # it ahead of that object): the assessment sets it only then.
    if st.preempted_by:
        doc["preempted_by"] = st.preempted_by
    if st.key.kind == "task":
        # The runs are the durable record of what ran (reconciler/observe/runs.py): a run Ray
        # forgot keeps what was recorded about it (times, log tail) from the previous document.
        before = {r.get("submission_id"): r for r in prev.get("runs") or [] if isinstance(r, dict)}
        doc["runs"] = [
            _keep(
                _run(
                    j.submission_id,
                    j.status,
                    redact(j.message),
                    j.start_time,
                    j.end_time,
                    log_tails,
                    checkpoints,
                    redact,
                )
                | _seen(j)
                | _steps(j)
                | {"spec_hash": j.spec_hash},
                before.get(j.submission_id),
            )
            for j in st.runs
        ]
        # Append-only: a recorded run this status does not list (a report built before the run
        # was recorded and submitted, written after) stays on record, ahead of the listed ones.
        listed = {j.submission_id for j in st.runs}
        kept = [r for sid, r in before.items() if sid not in listed and isinstance(sid, str)]
        if kept:
            doc["runs"] = [*kept, *doc["runs"]]
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
    redact: Callable[[str], str],
) -> dict[str, Any]:
    run: dict[str, Any] = {"submission_id": sid, "status": status, "start_time": _ms(start), "end_time": _ms(end)}
    if message:
        run["message"] = message
    if checkpoints.get(sid):
        run["checkpoint"] = checkpoints[sid]
    # Only finished runs keep a log tail: a live tail would make a commit every tick.
    if status in FINAL_JOB_STATES and log_tails.get(sid):
        run["log_tail"] = redact("\n".join(log_tails[sid])).split("\n")  # whole: a key block spans lines
    return run


def _seen(job: ActualJob) -> dict[str, str]:
    """What the daemon itself saw of a run (:data:`SEEN_FIELDS`, its own clock; transition times:
    each is set once), which bounds what Ray's record is believed about it."""
    out: dict[str, str] = {}
    for name in SEEN_FIELDS:
        value = getattr(job, name)
        if value is not None:
            out[name] = _iso_ms(value)
    return out


def _steps(job: ActualJob) -> dict[str, int]:
    """A run's checkpoint steps: the newest one while it runs (kept once it ends) and, for a resumed
    attempt, the one it resumed from."""
    out: dict[str, int] = {}
    if job.resumed_from_step is not None:
        out["resumed_from_step"] = job.resumed_from_step
    if job.checkpoint_step is not None:
        out["checkpoint_step"] = job.checkpoint_step
    return out


def _keep(run: dict[str, Any], recorded: Mapping[str, Any] | None) -> dict[str, Any]:
    """``run`` with what ``recorded`` (the same run's previous entry) knew and ``run`` does not."""
    if not recorded:
        return run
    for field in ("start_time", "end_time", *SEEN_FIELDS, "message", "checkpoint", "log_tail", *_STEP_FIELDS):
        if run.get(field) in (None, "") and recorded.get(field) not in (None, ""):
            run[field] = recorded[field]
    ordered = {k: run[k] for k in _RUN_ORDER if k in run}  # recorded fields in their usual place
    ordered.update(run)
    return ordered


_STEP_FIELDS = ("resumed_from_step", "checkpoint_step")
# A run record's times of the daemon's own (reconciler/observe/sightings.py reads them back).
SEEN_FIELDS = ("submitted_at", "seen_running", "seen_ended")
_RUN_ORDER = [
    "submission_id",
    "status",
    "start_time",
    "end_time",
    *SEEN_FIELDS,
    "message",
    "checkpoint",
    *_STEP_FIELDS,
    "log_tail",
    "spec_hash",
]


def _ms(value: int | None) -> str | None:
    if not value:
        return None
    import datetime as _dt

    return _dt.datetime.fromtimestamp(value / 1000, tz=_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _iso_ms(epoch: float) -> str:
    """``epoch`` as ``%Y-%m-%dT%H:%M:%SZ``, with milliseconds where it has any (a sighting bounds
    Ray's times, which are milliseconds: rounded to the second, it would cut a run short)."""
    ms = round(epoch * 1000)
    whole = _iso(ms // 1000)
    return whole if ms % 1000 == 0 else f"{whole[:-1]}.{ms % 1000:03d}Z"


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


# libyaml's C emitter when PyYAML was built with it: ~10x faster than the pure-Python one.
_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
# Status documents are written by argus only, so the C loader's plain safe parsing is enough.
LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def dump(doc: Mapping[str, Any]) -> bytes:
    """One status document as YAML (keys in document order, unicode kept, no line folding)."""
    text: str = yaml.dump(dict(doc), Dumper=_DUMPER, sort_keys=False, allow_unicode=True, width=1000)
    return text.encode("utf-8", "backslashreplace")  # a lone surrogate the redaction missed: escaped, not raised


def dump_json(data: Any, raw: Mapping[str, str] | None = None) -> bytes:
    """Machine-read files (``actual.json``): the C JSON encoder, one list entry per line so that
    a change shows as a small diff. ``raw``: members already serialised (name -> JSON text),
    placed in the same sorted order (and in place of ``data``'s member of that name)."""
    if not isinstance(data, Mapping):
        return (json.dumps(data, sort_keys=True) + "\n").encode()
    raw = raw or {}
    parts = []
    for name in sorted({*data, *raw}):
        value = data.get(name)
        if name in raw:
            parts.append(f"{json.dumps(name)}: {raw[name]}")
        elif isinstance(value, list) and value:
            inner = ",\n  ".join(json.dumps(v, sort_keys=True) for v in value)
            parts.append(f"{json.dumps(name)}: [\n  {inner}\n ]")
        else:
            parts.append(f"{json.dumps(name)}: {json.dumps(value, sort_keys=True)}")
    return ("{\n " + ",\n ".join(parts) + "\n}\n").encode()


TABLE_HEAD = (
    "| user | kind | name | state | sync | endpoint / job | updated |",
    "|---|---|---|---|---|---|---|",
)


def _one_line(text: object) -> str:
    """``text`` on one line: a line break shows as ``⏎`` and cannot start a row, heading or link."""
    return " ⏎ ".join(str(text).splitlines()) if str(text) else ""


def _cell(text: object) -> str:
    """``text`` as one markdown table cell: one line, ``|`` escaped so it cannot end the cell."""
    return _one_line(text).replace("|", "\\|")


def code_span(text: object, *, cell: bool = False) -> str:
    """``text`` (which jobs or users may control) as one inline code span: one line, its backticks
    shown as ``'`` so none can close the span (the web view reads these spans back);
    ``cell``: ``|`` escaped too, for a table cell."""
    flat = _cell(text) if cell else _one_line(text)
    return "`" + flat.replace("`", "'") + "`"


def readme_row(path: str, doc: Mapping[str, Any]) -> str:
    """The README table row of one status document."""
    user, kinds, name = path.split("/")[1], path.split("/")[2], path.split("/")[3].removesuffix(".yaml")
    where = code_span(doc.get("served_name") if kinds == "models" else doc.get("submission_id") or "-", cell=True)
    cells = [user, kinds[:-1], name, doc.get("state"), doc.get("sync"), doc.get("last_transition")]
    text = [_cell(c) for c in cells]
    return "| " + " | ".join([*text[:5], where, text[5]]) + " |"


README_ROWS = 1_000  # objects listed in the README's table (a git host renders no more usefully)
README_MESSAGES = 200  # validation errors, notes and alerts listed there (the note holds them all)
_BULK = 256  # above this many new rows the order is sorted again rather than edited in place


class ReadmeRows:
    """The README's table rows by object path, and their paths in order: kept sorted as rows come
    and go (O(changed) per write; a README is rebuilt from the first :data:`README_ROWS`)."""

    def __init__(self, rows: Mapping[str, str] | None = None) -> None:
        self.rows: dict[str, str] = dict(rows or {})
        self.order: list[str] = sorted(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def copy(self) -> ReadmeRows:
        """An independent copy (C-speed copies of both)."""
        new = ReadmeRows()
        new.rows, new.order = dict(self.rows), list(self.order)
        return new

    def update(self, rows: Mapping[str, str]) -> None:
        """Set these rows (new paths take their place in the order)."""
        new = [path for path in rows if path not in self.rows]
        self.rows.update(rows)
        if len(new) > _BULK:
            self.order = sorted(self.rows)
        else:
            for path in new:
                insort(self.order, path)

    def discard(self, path: str) -> None:
        """Drop ``path``'s row, if any."""
        if self.rows.pop(path, None) is not None:
            del self.order[bisect_left(self.order, path)]


def readme(
    rows: Mapping[str, str] | ReadmeRows,
    *,
    revision: str | None,
    errors: list[str],
    last_applied: str | None = None,
    daemon_error: str | None = None,
) -> bytes:
    """The status branch's README.md: a markdown table of the objects (``rows``: path -> row, or
    the writer's :class:`ReadmeRows`), the first :data:`README_ROWS` by path, and ``errors`` (the
    first :data:`README_MESSAGES`). Every object's own document is the whole truth; the page lists
    them all."""
    table = rows if isinstance(rows, ReadmeRows) else ReadmeRows(rows)
    lines = [
        "# argus status",
        "",
        "Written by the argus daemon; do not edit. "
        "One file per object mirrors `users/<user>/{models,tasks}/<name>.yaml`; "
        "`revision.yaml` holds the desired revisions.",
        "",
        f"Desired revision: {code_span(revision or 'unknown')} "
        f"(last applied without failures: {code_span(last_applied or 'none')})",
        "",
    ]
    if daemon_error:
        lines += [f"**The daemon's last tick failed:** {code_span(daemon_error)} (it retries with back-off)", ""]
    lines += [*TABLE_HEAD]
    lines += [table.rows[path] for path in table.order[:README_ROWS]]
    if len(table) > README_ROWS:
        lines += [
            "",
            f"{len(table) - README_ROWS:,} more objects are not listed here ({len(table):,} in all): each has "
            "its status document at its own path under `users/`, and the status page lists them all.",
        ]
    if errors:
        lines += ["", "## Validation errors at this revision", ""]
        lines += [f"- {code_span(e)}" for e in errors[:README_MESSAGES]]
        if len(errors) > README_MESSAGES:
            more = len(errors) - README_MESSAGES
            lines += [f"- … and {more:,} more (the revision's git note lists every validation error)"]
    # Rows come from the branch's documents as read (a forged one, read by PyYAML without libyaml,
    # may hold a lone surrogate): escaped, never a write that fails for every object.
    return ("\n".join(lines) + "\n").encode("utf-8", "backslashreplace")
