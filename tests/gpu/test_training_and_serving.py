"""argus's rendered verl jobs and a ``task:`` model on a real GPU (``make gpu-check``).

Each test submits the Ray Job bodies argus's builder renders from the suite's config repository (tests/gpu/scenario.py)
to a private Ray head with the host's GPUs, stops runs the way argus preempts them, resumes them the way the planner
does, and reads the results with argus's own observer and checkpoint lookup. In this order (one module: the Serve
test comes last, when no job holds the GPU):

(a) SFT with ``steps`` above one epoch trains to its last step and saves there, with saves on the cadence before;
(b) SFT stopped after a cadence checkpoint resumes from it in argus's resumed attempt and finishes;
(c) PPO and GRPO the same (their resumed runs also cross an epoch), when vLLM is installed;
(d) the ``source: task:`` model serves the SFT checkpoint through Ray Serve LLM and answers an OpenAI chat request.

Figures and how to read a failure: docs/admins/gpu-and-cpu-modes.md#checking-a-new-gpu-host.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import pytest

from reconciler.dashboard import Dashboard
from reconciler.observe.jobs import checkpoint_of, find_hf_checkpoint
from reconciler.spec.types import DesiredState
from reconciler.testing.deps import require
from reconciler.testing.ray_head import RayHead
from tests.gpu import scenario
from tests.gpu.runner import RL_JOB_S, SFT_JOB_S, JobRun, Resumed, preempt_and_resume, say

pytestmark = pytest.mark.gpu

SERVE_DEADLINE_S = 420
# pytest-timeout's limits include the session's set-up for whichever test comes first (model and data, SmolLM2's
# conversion on a first run, the Ray head): they back up the runner's own deadlines, which come first.
SETUP_S = 360


def _checkpoint_found(state: DesiredState, name: str, sid: str, checkpoints: Path, step: int) -> str:
    """argus's lookup of the servable checkpoint of run ``sid``: the HF folder of ``global_step_<step>`` under
    ``checkpoints`` (the run's first attempt's); returns it."""
    found = checkpoint_of(state.cluster.paths, scenario.USER, name, sid)
    assert found is not None, f"checkpoint_of finds nothing for {sid}:\n{scenario.describe(checkpoints.parent)}"
    assert Path(found).is_relative_to(checkpoints / f"global_step_{step}"), (found, checkpoints, step)
    assert found == find_hf_checkpoint(str(checkpoints.parent)), "checkpoint_of and find_hf_checkpoint disagree"
    assert (Path(found) / "config.json").is_file()
    return found


def _generate(folder: str) -> str:
    """Load an HF checkpoint on the GPU with transformers and greedily generate a few tokens."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model: Any = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).cuda().eval()
    ids = tok.apply_chat_template(
        [{"role": "user", "content": "What is argus?"}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if hasattr(ids, "keys") else ids
    out = model.generate(ids.cuda(), max_new_tokens=12, do_sample=False)
    assert out.shape[1] > ids.shape[1], "generation produced no token"
    text = str(tok.decode(out[0][ids.shape[1] :], skip_special_tokens=True))
    del model
    torch.cuda.empty_cache()
    return text


@pytest.mark.timeout(SETUP_S + SFT_JOB_S + 60)
def test_sft_steps_above_one_epoch_trains_to_the_last_step_and_saves_there(
    sft_steps_run: JobRun, state: DesiredState
) -> None:
    name = "sft-steps"
    steps, every = scenario.TASKS[name]["steps"], scenario.save_freq(name)
    assert steps > scenario.steps_per_epoch(name), "the task must ask for more steps than one epoch has"
    job = scenario.body(state, name)
    assert scenario.contract_problems(state, name, job) == []
    run = sft_steps_run
    assert run.status == "SUCCEEDED", run.explain()
    assert scenario.logged_steps(run.log) == list(range(1, steps + 1)), (
        f"verl did not train steps 1..{steps} (an epoch has {scenario.steps_per_epoch(name)}): {run.explain()}"
    )
    assert scenario.logged_saves(run.log) == scenario.expected_saves(steps, every), (
        f"saves not on the cadence {every} and at step {steps}: {run.explain()}"
    )
    checkpoints = scenario.run_folder(job) / "checkpoints"
    assert scenario.tracker_step(checkpoints) == steps, scenario.describe(checkpoints)
    assert scenario.saved_folders(checkpoints) == scenario.expected_saves(steps, every)[-scenario.KEEP :], (
        f"the keep-limit {scenario.KEEP} leaves the newest checkpoints:\n{scenario.describe(checkpoints)}"
    )
    losses = scenario.logged_losses(run.log)
    assert losses[steps] < losses[1], f"no learning: train/loss {losses}"
    found = _checkpoint_found(state, name, run.submission_id, checkpoints, steps)
    say(f"{name}: loss {losses[1]:.2f} -> {losses[steps]:.2f}; checkpoint {found} generates {_generate(found)!r}")


def _check_resumed(state: DesiredState, name: str, resumed: Resumed) -> None:
    """What a preempted and resumed run must show (tests (b) and (c))."""
    steps, every, at = scenario.TASKS[name]["steps"], scenario.save_freq(name), resumed.checkpoint
    first, second = resumed.first, resumed.second
    assert scenario.contract_problems(state, name, resumed.first_body) == []
    assert scenario.contract_problems(state, name, resumed.second_body, attempt=2) == []
    assert 0 < at < steps and at % every == 0, f"stopped at checkpoint step {at} (cadence {every}, {steps} steps)"
    before = scenario.logged_steps(first.log)
    assert before and before[0] == 1 and max(before) < steps, f"attempt 1 logged steps {before}"
    if first.observed_steps:  # argus's status: a running run's newest checkpoint step
        assert set(first.observed_steps) <= set(scenario.expected_saves(steps, every)), first.observed_steps
    assert second.status == "SUCCEEDED", second.explain()
    assert scenario.resumed_step(second.log) == at, (
        f"the resumed attempt's log does not say it loaded global_step_{at}: {second.explain()}"
    )
    after = scenario.logged_steps(second.log)
    assert after == list(range(at + 1, steps + 1)), (
        f"the resumed attempt must run steps {at + 1}..{steps} only (none before the checkpoint), logged {after}"
    )
    if second.resumed_from_step is not None:  # argus's status: "resumed from step N"
        assert second.resumed_from_step == at
    assert scenario.tracker_step(resumed.checkpoints) == steps, scenario.describe(resumed.checkpoints)
    # Not a count: verl's keep-limit covers the checkpoints its own process saved, so attempt 1's stay behind.
    saved = scenario.saved_folders(resumed.checkpoints)
    assert saved and saved[-1] == steps, scenario.describe(resumed.checkpoints)
    own = scenario.run_folder(resumed.second_body) / "checkpoints"
    assert scenario.saved_folders(own) == [], f"the resumed attempt saved into its own folder {own}, not the run's"
    found = _checkpoint_found(state, name, second.submission_id, resumed.checkpoints, steps)
    say(f"{name}: stopped at checkpoint {at}, resumed {after[0]}..{after[-1]}; served folder {found}")


@pytest.mark.timeout(SETUP_S + 2 * SFT_JOB_S + 60)
def test_sft_stopped_after_a_checkpoint_resumes_from_it(dash: Dashboard, state: DesiredState) -> None:
    _check_resumed(state, "sft-resume", preempt_and_resume(dash, state, "sft-resume", timeout_s=SFT_JOB_S))


@pytest.mark.timeout(SETUP_S + 2 * RL_JOB_S + 60)
@pytest.mark.parametrize("name", ["ppo-resume", "grpo-resume"])
def test_rl_stopped_after_a_checkpoint_resumes_from_it(dash: Dashboard, state: DesiredState, name: str) -> None:
    require("vllm")
    assert scenario.TASKS[name]["steps"] > scenario.steps_per_epoch(name)
    _check_resumed(state, name, preempt_and_resume(dash, state, name, timeout_s=RL_JOB_S))


@pytest.mark.timeout(SETUP_S + SFT_JOB_S + SERVE_DEADLINE_S + 60)
def test_task_model_serves_the_checkpoint_and_answers(
    sft_steps_run: JobRun, state: DesiredState, dash: Dashboard, gpu_head: RayHead
) -> None:
    require("ray.serve.llm", "vllm", "openai")
    import openai

    from reconciler.apply.serve import apply_serve
    from reconciler.builders.serve import ROUTER_APP, app_name, model_app_config
    from reconciler.observe.serve import observe_serve
    from reconciler.spec.hashing import model_spec_hash

    assert sft_steps_run.status == "SUCCEEDED", f"nothing to serve: {sft_steps_run.explain()}"
    model = scenario.served_model(state)
    assert model.source_task == scenario.SERVED_TASK
    # What the daemon does for a `task:` source: the newest checkpoint of the task's succeeded run.
    checkpoint = checkpoint_of(state.cluster.paths, scenario.USER, model.source_task, sft_steps_run.submission_id)
    assert checkpoint is not None
    app = model_app_config(model, state.cluster, checkpoint, model_spec_hash(model, state.cluster, checkpoint))
    names = [app_name(scenario.USER, scenario.SERVED_MODEL), ROUTER_APP]
    started = time.monotonic()
    try:
        assert apply_serve(dash, [app], observe_serve(dash), state.cluster) is True
        while True:
            obs = observe_serve(dash)
            statuses = {n: obs.statuses.get(n) for n in names}
            failed = [n for n, s in statuses.items() if s == "DEPLOY_FAILED"]
            assert not failed, f"{failed}: {[obs.messages.get(n) for n in failed]}\n{gpu_head.engine_log_tails()}"
            if all(s == "RUNNING" for s in statuses.values()):
                break
            assert time.monotonic() - started < SERVE_DEADLINE_S, (
                f"not RUNNING after {SERVE_DEADLINE_S}s: {statuses}\n{gpu_head.engine_log_tails()}"
            )
            time.sleep(2)
        say(f"{names[0]} RUNNING on {checkpoint} after {time.monotonic() - started:.0f}s")
        client = openai.OpenAI(base_url=gpu_head.serve_url + "/v1", api_key="none", max_retries=0, timeout=120)
        for _ in range(30):  # the router learns the new model's name within a few seconds
            if model.served_name in {m.id for m in client.models.list().data}:
                break
            time.sleep(2)
        for name in (model.served_name, model.alias):
            chat = client.chat.completions.create(
                model=name, messages=[{"role": "user", "content": "What is argus?"}], max_tokens=12, temperature=0
            )
            assert chat.choices[0].message.content is not None
            assert chat.usage is not None and chat.usage.completion_tokens >= 1
            say(f"{name} answers {chat.choices[0].message.content!r}")
    finally:
        with contextlib.suppress(Exception):
            dash.delete("/api/serve/applications/")  # frees the GPU for whatever runs next
