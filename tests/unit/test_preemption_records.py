"""What preemption needs outside the planner: the resumed attempt's submission (ARGUS_RESUME, verl's
resume_mode=auto), the status branch's records read back (and what a hand-edited record can and
cannot do), the documents, the per-team view on the page and in ``argus plan``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from reconciler.builders.jobs import checkpoint_dir, entrypoint_argv, job_submission, run_dir
from reconciler.observe.jobs import checkpoint_of
from reconciler.observe.runs import preemptions
from reconciler.plan import render
from reconciler.plan.actions import Action, ActionType, Plan
from reconciler.plan.actual import PREEMPTED, ActualJob, ActualState
from reconciler.plan.assess import ObjectStatus, assess
from reconciler.spec.hashing import submission_id, task_spec_hash
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey, Paths, Training
from reconciler.status.documents import object_document
from reconciler.web import view
from tests.support import task_spec

CLUSTER = ClusterSpec(
    paths=Paths(common="/shared/hf", users="/shared/users"),
    training=Training(driver_resources={"worker_node": 1.0}),
)
TRAIN = "/shared/users/alice/data/train.parquet"
MODEL_DIR = "/shared/hf/hub/models--Qwen--Qwen2.5-0.5B/snapshots/abc"


def test_a_resumed_command_attempt_gets_argus_resume_and_the_previous_folder() -> None:
    task = task_spec("alice", "ft", "command", command="python train.py", gpus_per_node=1)
    first = submission_id(task)
    body = job_submission(task, CLUSTER, revision=None, secrets_env={}, sid=f"{first}--2", resume_from=first)
    env = body["runtime_env"]["env_vars"]
    assert env["ARGUS_RESUME"] == "1"
    assert env["ARGUS_RESUME_DIR"] == run_dir(task, CLUSTER, first)
    assert env["ARGUS_RUN_DIR"] == run_dir(task, CLUSTER, f"{first}--2")  # its own folder for new output
    fresh = job_submission(task, CLUSTER, revision=None, secrets_env={})["runtime_env"]["env_vars"]
    assert "ARGUS_RESUME" not in fresh and "ARGUS_RESUME_DIR" not in fresh


def test_a_resumed_verl_attempt_resumes_from_the_runs_own_checkpoints_and_user_overrides_still_win() -> None:
    task = task_spec(
        "alice",
        "grpo",
        "grpo",
        model="Qwen/Qwen2.5-0.5B",
        model_path=MODEL_DIR,
        data_train=TRAIN,
        overrides=("trainer.save_freq=5",),
    )
    first = submission_id(task)
    body = job_submission(
        task, CLUSTER, revision=None, secrets_env={}, sid=f"{first}--3", resume_from=f"{first}--2", first_attempt=first
    )
    argv = entrypoint_argv(body["entrypoint"])
    root = checkpoint_dir(run_dir(task, CLUSTER, first))
    assert argv[-3:] == ["trainer.resume_mode=auto", f"trainer.default_local_dir={root}", "trainer.save_freq=5"]
    assert argv.count("trainer.resume_mode=auto") == 1


def test_a_resumed_attempts_checkpoint_is_found_in_the_runs_first_folder(tmp_path: Path) -> None:
    paths = Paths(common=str(tmp_path / "hf"), users=str(tmp_path / "users"))
    sid = "argus--alice--grpo--0123abcd"
    hf = (
        tmp_path / "users" / "alice" / "jobs" / "grpo" / sid / "checkpoints" / "global_step_3" / "actor" / "huggingface"
    )
    hf.mkdir(parents=True)
    (hf / "config.json").write_text("{}")
    (hf / "model.safetensors").write_bytes(b"x")
    assert checkpoint_of(paths, "alice", "grpo", f"{sid}--2") == str(hf)
    assert checkpoint_of(paths, "alice", "other", f"{sid}--2") is None


def test_preemption_records_are_read_only_for_their_own_object() -> None:
    """A hand-edited status document can only mark its *own* runs preempted (never another user's
    run, never a run Ray reports finished: the tick maps only STOPPED), and names a preemptor
    only for itself."""
    docs = {
        "users/alice/tasks/t.yaml": {
            "object": "alice/tasks/t",
            "runs": [
                {"submission_id": "argus--alice--t--0123abcd", "status": PREEMPTED},
                {"submission_id": "argus--bob--x--0123abcd", "status": PREEMPTED},  # another task's id
                {"submission_id": "not-an-id", "status": PREEMPTED},
                {"submission_id": "argus--alice--t--0123abcd--2", "status": "RUNNING"},
            ],
            "preempted_by": "bob/models/chat",
        },
        "users/bob/models/chat.yaml": {"object": "carol/tasks/z", "preempted_by": "not a key"},
        "users/carol/tasks/y.yaml": ["not", "a", "mapping"],
        "README.md": {"runs": [{"submission_id": "argus--alice--t--0123abcd--3", "status": PREEMPTED}]},
    }
    sids, by = preemptions(docs)  # type: ignore[arg-type]
    assert sids == {"argus--alice--t--0123abcd"}
    assert by == {ObjectKey("alice", "task", "t"): ObjectKey("bob", "model", "chat")}


def test_a_preempted_task_is_preempted_in_its_document_until_it_runs_again() -> None:
    task = task_spec("alice", "t", "command", command="true")
    key, sid = task.key, submission_id(task)
    desired = DesiredState(CLUSTER, tasks={key: task})
    bob = ObjectKey("bob", "model", "chat")
    job = ActualJob(sid, key, task_spec_hash(task), PREEMPTED, message="Preempted by bob/models/chat (reclaim)")
    actual = ActualState(jobs=[job], preempted={key: bob})
    waiting = Plan([Action(ActionType.QUEUE, key, "WaitingForQuota: team research ...")])
    status = assess(desired, actual, waiting)[key]
    assert (status.state, status.preempted_by) == ("PREEMPTED", "bob/models/chat")
    doc = object_document(status, None, revision="r", applied=True, now="t", endpoint="e", log_tails={}, checkpoints={})
    assert doc["preempted_by"] == "bob/models/chat" and doc["runs"][0]["status"] == PREEMPTED
    running = ActualState(jobs=[job, ActualJob(f"{sid}--2", key, task_spec_hash(task), "RUNNING", start_time=5)])
    running.preempted = {key: bob}
    again = assess(desired, running, Plan())[key]
    assert again.state == "RUNNING" and again.preempted_by is None
    doc = object_document(again, doc, revision="r", applied=True, now="t2", endpoint="e", log_tails={}, checkpoints={})
    assert "preempted_by" not in doc
    assert [r["status"] for r in doc["runs"]] == [PREEMPTED, "RUNNING"]


def test_the_page_and_argus_plan_show_each_teams_quota_and_what_is_preempted() -> None:
    usage = {
        "research": {
            "nominal": {"gpus": 4.0},
            "used": {"gpus": 2.0},
            "borrowed": {"gpus": 0.0},
            "lent": {"gpus": 2.0},
            "share": 0.0,
            "weight": 1.0,
        },
        "<script>": "not a mapping",
    }
    rows = view.teams({"revision.yaml": {"teams": usage}, "actual.json": {"teams": {"x": {}}}})
    assert [(r.name, r.used, r.nominal, r.lent) for r in rows] == [("<script>", 0.0, 0.0, 0.0), ("research", 2, 4, 2)]
    victim = ObjectKey("alice", "task", "t")
    stop = Action(
        ActionType.STOP_TASK,
        victim,
        "Preempted by bob/models/chat (reclaim): stopping run x",
        submission_id="x",
        preempted_by=ObjectKey("bob", "model", "chat"),
        preemption="reclaim",
    )
    plan = Plan([stop], teams={"research": usage["research"]})  # type: ignore[dict-item]
    text = render.text(plan, [])
    assert "Preempts: alice/tasks/t (for bob/models/chat, reclaim)." in text
    assert "team research: uses 2 GPU of nominal 4 GPU; borrowed 0 GPU; lent 2 GPU" in text
    assert "| `research` |" in render.markdown(plan, [])
    assert ObjectStatus(victim, "PREEMPTED", "OutOfSync", preempted_by="bob/models/chat").to_json()["preempted_by"]


def test_a_resumed_attempt_says_where_it_resumed_and_its_runs_keep_their_newest_checkpoint() -> None:
    """Issue 30: the running run's newest checkpoint step and, for a resumed attempt, "resumed from step N";
    both stay on the run's record once it ends (Ray stops reporting the step, the document keeps it)."""
    task = task_spec("alice", "t", "command", command="true")
    key, sid, digest = task.key, submission_id(task), task_spec_hash(task)
    desired = DesiredState(CLUSTER, tasks={key: task})
    first = ActualJob(sid, key, digest, PREEMPTED, start_time=1, checkpoint_step=8)
    second = ActualJob(f"{sid}--2", key, digest, "RUNNING", start_time=5, checkpoint_step=12, resumed_from_step=8)
    status = assess(desired, ActualState(jobs=[first, second]), Plan())[key]
    assert status.state == "RUNNING" and "resumed from step 8" in status.reason
    doc = object_document(status, None, revision="r", applied=True, now="t", endpoint="e", log_tails={}, checkpoints={})
    assert [(r.get("resumed_from_step"), r.get("checkpoint_step")) for r in doc["runs"]] == [(None, 8), (8, 12)]
    done = ActualJob(f"{sid}--2", key, digest, "SUCCEEDED", start_time=5, end_time=9, resumed_from_step=8)
    ended = assess(desired, ActualState(jobs=[replace(first, checkpoint_step=None), done]), Plan())[key]
    assert "resumed" not in ended.reason  # a finished attempt's reason is its result
    doc = object_document(ended, doc, revision="r", applied=True, now="t2", endpoint="e", log_tails={}, checkpoints={})
    assert [(r.get("resumed_from_step"), r.get("checkpoint_step")) for r in doc["runs"]] == [(None, 8), (8, 12)]
    nothing = replace(second, resumed_from_step=0, checkpoint_step=None)
    assert "resumed from step 0: the preempted attempt left no checkpoint" in (
        assess(desired, ActualState(jobs=[first, nothing]), Plan())[key].reason
    )
