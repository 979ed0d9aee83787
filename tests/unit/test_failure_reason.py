"""A failed task's reason is its error, not Ray's first log lines (issue 21 item 7)."""

from __future__ import annotations

from reconciler.plan.assess import REASON_CHARS, failure_reason

HEADER = "Job entrypoint command failed with exit code 1, last available logs (truncated to 20,000 chars):\n"


def test_the_error_the_log_ends_with_comes_first() -> None:
    message = HEADER + (
        "Runtime env is setting up.\n"
        "Running entrypoint for job argus--alice--t--1: python3 -m verl.trainer.main_ppo\n"
        "(TaskRunner pid=4711) Traceback (most recent call last):\n"
        '(TaskRunner pid=4711)   File "main_ppo.py", line 9, in run\n'
        "(TaskRunner pid=4711)     assert bsz % n == 0\n"
        "(TaskRunner pid=4711) AssertionError: train_batch_size 7 must be divisible by 4\n"
    )
    assert failure_reason(message) == (
        "AssertionError: train_batch_size 7 must be divisible by 4 (Job entrypoint command failed with exit code 1)"
    )


def test_without_an_error_line_the_last_line_is_the_reason() -> None:
    assert failure_reason(HEADER + "Runtime env is setting up.\nkilled the trainer after 3 steps\n") == (
        "killed the trainer after 3 steps (Job entrypoint command failed with exit code 1)"
    )
    assert failure_reason(HEADER + "Runtime env is setting up.\n") == "Job entrypoint command failed with exit code 1"


def test_other_messages_stay_as_ray_wrote_them_and_are_bounded() -> None:
    assert failure_reason("Job entrypoint command failed with exit code 137. No logs available.") == (
        "Job entrypoint command failed with exit code 137. No logs available."
    )
    assert len(failure_reason("x" * 10_000)) == REASON_CHARS
    assert len(failure_reason(HEADER + "ValueError: " + "y" * 10_000)) == REASON_CHARS


def test_the_status_of_a_failed_run_carries_the_error_and_the_run_keeps_rays_message() -> None:
    from reconciler.plan.actions import Plan
    from reconciler.plan.actual import ActualJob, ActualState
    from reconciler.plan.assess import assess
    from reconciler.spec.hashing import task_spec_hash
    from reconciler.spec.types import ClusterSpec, DesiredState
    from tests.support import task_spec

    task = task_spec("alice", "t", command="python train.py")
    message = HEADER + "Runtime env is setting up.\nRuntimeError: CUDA out of memory\n"
    job = ActualJob("argus--alice--t--1", task.key, task_spec_hash(task), "FAILED", message=message)
    desired = DesiredState(cluster=ClusterSpec(), tasks={task.key: task})
    status = assess(desired, ActualState(jobs=[job]), Plan())[task.key]
    assert status.state == "FAILED"
    assert status.reason == "RuntimeError: CUDA out of memory (Job entrypoint command failed with exit code 1)"
    assert status.runs[0].message == message
