"""Table-driven planner cases, stored as files under ``tests/cases/planner/<case>/``.

Each case folder holds:

- ``repo/``: the desired tree (``cluster.yaml``, ``users/<user>/{models,tasks}/*.yaml``), loaded offline;
- ``actual.json``: the actual state in the documented JSON form (``reconciler/plan/actual.py``). A
  ``spec_hash`` or ``submission_id`` written ``"@desired"`` stands for the value the current desired
  file yields (what the cluster holds when it matches the repository), so cases do not break when
  the hash recipe changes; also in ``recorded_runs`` (runs the status branch recorded), and
  ``"@desired:<user>/<task>"`` in ``foreign_ids`` is that task's first-choice submission id;
- ``expected.json``: ``{"actions": [[action, object, reason substring, {optional exact fields}], ...],
  "deletions_held": bool, "notes": [substring, ...]}``: the actions in the planner's order, exactly;
  every note listed must appear (and no note at all when the list is empty);
- ``created.json`` (optional): path -> UTC epoch of the commit that added it (first come, first
  served order); other paths get ``DEFAULT_TIME``;
- ``options.json`` (optional): ``{"approve_prune": true}`` for the loader, ``"now": <epoch>`` for the
  planner's clock (objects without a ``first_seen`` entry in ``actual.json`` were first seen then).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from reconciler.plan.actual import ActualState
from reconciler.plan.incremental import IncrementalPlanner
from reconciler.plan.planner import latest_success, plan
from reconciler.spec.hashing import model_spec_hash, submission_id, task_spec_hash
from reconciler.spec.loader import SourceFile, load
from reconciler.spec.types import DesiredState, ObjectKey

CASES = Path(__file__).resolve().parents[1] / "cases" / "planner"
DEFAULT_TIME = 1767225600  # 2026-01-01 00:00 UTC
DESIRED = "@desired"


def read_tree(root: Path) -> list[SourceFile]:
    """Every file under ``root`` as the loader's SourceFile (what a git snapshot gives)."""
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        content = path.read_bytes()
        files.append(SourceFile(path.relative_to(root).as_posix(), content, hashlib.sha1(content).hexdigest()))
    return files


def load_case(case: Path) -> tuple[DesiredState, ActualState, dict[str, Any]]:
    """Load a case folder: (desired, actual with placeholders resolved, expected); the planner's
    keyword arguments (``now``) are in ``expected["plan_options"]``."""
    created_file = case / "created.json"
    created = json.loads(created_file.read_text()) if created_file.exists() else {}
    options_file = case / "options.json"
    options = json.loads(options_file.read_text()) if options_file.exists() else {}
    plan_options = {k: options.pop(k) for k in ("now",) if k in options}
    repo = case / "repo"
    files = read_tree(repo) if repo.exists() else []
    desired = load(files, created=created, default_time=DEFAULT_TIME, fs=None, **options)
    raw_actual = json.loads((case / "actual.json").read_text())
    actual = ActualState.from_json(resolve_placeholders(raw_actual, desired))
    expected = json.loads((case / "expected.json").read_text())
    expected["plan_options"] = plan_options
    return desired, actual, expected


def resolve_placeholders(raw: dict[str, Any], desired: DesiredState) -> dict[str, Any]:
    """Replace ``"@desired"`` hashes and submission ids by the desired files' own values."""
    out = json.loads(json.dumps(raw))
    for i, sid in enumerate(out.get("foreign_ids", [])):
        if sid.startswith(DESIRED + ":"):  # "@desired:<user>/<task>": that task's first-choice id
            user, name = sid.split(":", 1)[1].split("/")
            out["foreign_ids"][i] = submission_id(desired.tasks[ObjectKey(user, "task", name)])
    for job in [*out.get("jobs", []), *out.get("recorded_runs", [])]:
        task = desired.tasks.get(ObjectKey(job["user"], "task", job["task"]))
        for field, value in (("spec_hash", task_spec_hash), ("submission_id", submission_id)):
            if job.get(field) == DESIRED:
                assert task is not None, f"{field}: {DESIRED} names a task with no valid desired file"
                job[field] = value(task)
    jobs = ActualState.from_json({"jobs": out.get("jobs", [])}).jobs
    for model in out.get("models", []):
        if model.get("spec_hash") != DESIRED:
            continue
        spec = desired.models.get(ObjectKey(model["user"], "model", model["name"]))
        assert spec is not None, f"spec_hash: {DESIRED} names a model with no valid desired file"
        checkpoint = None
        if spec.source_task:
            task_key = ObjectKey(spec.key.user, "task", spec.source_task)
            done = latest_success(jobs, task_key)
            checkpoint = done.hf_checkpoint if done else None
        model["spec_hash"] = model_spec_hash(spec, desired.cluster, checkpoint)
    return out  # type: ignore[no-any-return]


def case_names() -> list[str]:
    return sorted(p.name for p in CASES.iterdir() if p.is_dir())


def test_there_are_enough_cases() -> None:
    assert len(case_names()) >= 25


@pytest.mark.parametrize("name", case_names())
def test_planner_case(name: str) -> None:
    desired, actual, expected = load_case(CASES / name)
    result = plan(desired, actual, **expected["plan_options"])
    got = [(a.type.value, str(a.key), a.reason) for a in result.actions]
    want = expected["actions"]
    shown = "\n".join(f"  {t} {k}: {r}" for t, k, r in got) or "  (none)"
    assert [(t, k) for t, k, _r in got] == [(w[0], w[1]) for w in want], f"actions differ; got:\n{shown}"
    for action, entry in zip(result.actions, want, strict=True):
        assert entry[2] in action.reason, f"{action.key}: reason {action.reason!r} lacks {entry[2]!r}"
        fields = action.to_json()
        for field, value in (entry[3] if len(entry) > 3 else {}).items():
            assert fields.get(field) == value, f"{action.key}: {field} is {fields.get(field)!r}, expected {value!r}"
    assert result.deletions_held is expected.get("deletions_held", False)
    notes = expected.get("notes", [])
    for note in notes:
        assert any(note in n for n in result.notes), f"no note contains {note!r}: {result.notes}"
    if not notes:
        assert result.notes == []
    # Issues expected from the desired tree (invalid files) are listed to show they were meant.
    assert sorted({i.path for i in desired.issues}) == sorted(expected.get("invalid_files", []))
    # The plan's verdict agrees with the actions (terraform exit code 2 when anything is pending).
    assert result.has_changes == any(t != "keep" for t, _k, _r in got)
    for key, when in expected.get("first_seen", {}).items():
        assert result.first_seen.get(ObjectKey.parse(key)) == when, f"{key}: first_seen {result.first_seen}"


def test_plan_is_sorted_by_the_one_order() -> None:
    """Across all cases, the actions come in the documented order (stops first ... keeps last)."""
    for name in case_names():
        desired, actual, expected = load_case(CASES / name)
        actions = plan(desired, actual, **expected["plan_options"]).actions
        assert [a.sort_key for a in actions] == sorted(a.sort_key for a in actions), name


@pytest.mark.parametrize("name", case_names())
def test_the_incremental_planner_plans_each_case_as_the_full_one(name: str) -> None:
    """The daemon plans with IncrementalPlanner: every case must come out of it exactly as from
    :func:`plan` (a rule added to one and not the other shows here by name)."""
    desired, actual, expected = load_case(CASES / name)
    assert IncrementalPlanner().plan(desired, actual, **expected["plan_options"]) == plan(
        desired, actual, **expected["plan_options"]
    )
