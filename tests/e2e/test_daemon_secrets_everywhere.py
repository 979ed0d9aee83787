"""``argus run`` on a real Ray head, real git: a FAILING and a succeeding job print every kind of
secret, plain and colour-coded, and none reaches anything argus writes, serves or logs (issue 18
item 2). A failed job matters most: Ray's message carries the last 20,000 characters of its log,
and that message went verbatim into ``actual.json``."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from reconciler.dashboard import Dashboard
from reconciler.status.branch import read_documents
from reconciler.testing.ray_head import RayHead
from tests.e2e.test_daemon import DaemonProc
from tests.support import ConfigRepo, git, site_repo, wait_for

WANDB = "wandb-0123456789abcdef-secret"
HF = "hf_DaemonOwnToken0123456789abcdefXYZ"
GH = "ghp_abcdefghijklmnopqrstuvwxyz0123456789"
AWS = "AKIAIOSFODNN7EXAMPLE"
PASSWORD = "hunter2-very-secret"
URL_TOKEN = "tok-in-url-0123"
KEY_BODY = "MIIEowIBAAKCAQEAsecretKeyBodyLine0123456789"
# What the tests grep for: each secret, and a fragment that no mask can hide by accident.
LEAKS = [WANDB, HF, GH, AWS, PASSWORD, URL_TOKEN, KEY_BODY, "0123456789abcdef-secret", "DaemonOwnToken"]

# Shell printing: token shapes, an assignment, URL credentials, a key block, a title escape and
# the daemon's own secrets from the job's environment, each also wrapped in colour codes.
# Ray's message of a failed run holds the last lines of its log: the daemon's own secrets come last.
PRINT = (
    f"echo 'token {GH} aws {AWS}'; "
    f"printf 'colour \\033[31m{GH}\\033[0m \\033[33m{AWS}\\033[0m\\n'; "
    f"echo 'DB_PASSWORD={PASSWORD}'; "
    f"printf 'DB_PASSWORD=\\033[35m{PASSWORD}\\033[0m\\n'; "
    f"echo 'clone https://alice:{URL_TOKEN}@git.example/cfg.git'; "
    f"printf -- '-----BEGIN RSA PRIVATE KEY-----\\n{KEY_BODY}\\n-----END RSA PRIVATE KEY-----\\n'; "
    "printf 'title \\033]0;spoofed\\007 done\\n'; "
    "printf 'HF_TOKEN=%s\\n' \"$HF_TOKEN\"; "
    'printf \'plain %s %s\\n\' "$WANDB_API_KEY" "$HF_TOKEN"; '
    'printf \'green \\033[32m%s\\033[0m \\033[1m%s\\033[0m\\n\' "$WANDB_API_KEY" "$HF_TOKEN"'
)
FAILING = "users/dora/tasks/fails.yaml"
SUCCEEDS = "users/dora/tasks/succeeds.yaml"


@pytest.fixture
def repo(ray_head: RayHead, tmp_path: Path) -> Iterator[ConfigRepo]:
    repo = site_repo(tmp_path, tmp_path / "hf", ray_head.serve_port, "dora")
    repo.commit_push("cluster")
    yield repo


def _everything_in_git(bare: Path) -> str:
    """Every blob of every commit of the status branch and the notes, and every commit message:
    all that argus writes to git (the config branch holds the users' own files)."""
    refs = ["argus/status", "refs/notes/argus"]
    out = [git(bare, "log", "--format=%B", *refs)]
    listing = git(bare, "rev-list", "--objects", "--filter=object:type=blob", *refs).split("\n")
    shas = [line.split(" ")[0] for line in listing if line.strip()]
    batch = subprocess.run(
        ["git", "-C", str(bare), "cat-file", "--batch"],
        input=("\n".join(shas) + "\n").encode(),
        capture_output=True,
        check=True,
    ).stdout
    out.append(batch.decode(errors="replace"))
    return "\n".join(out)


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            return str(resp.read().decode(errors="replace"))
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}: {exc.read().decode(errors='replace')}"


def test_secrets_printed_by_failing_and_succeeding_jobs_reach_nothing_argus_writes_serves_or_logs(
    ray_head: RayHead, repo: ConfigRepo, tmp_path: Path
) -> None:
    daemon = DaemonProc(repo, ray_head, tmp_path)
    daemon.start(extra_env={"WANDB_API_KEY": WANDB, "HF_TOKEN": HF})
    try:
        repo.write(FAILING, {"kind": "Task", "workload": "command", "command": PRINT + "; exit 3"})
        repo.write(SUCCEEDS, {"kind": "Task", "workload": "command", "command": PRINT})
        sha = repo.commit_push("dora: two tasks that print secrets")

        def final() -> dict[str, dict[str, object]] | None:
            docs = read_documents(str(repo.bare), "argus/status")
            want = {FAILING: "FAILED", SUCCEEDS: "SUCCEEDED"}
            done = all(
                (d := docs.get(p) or {}).get("state") == s and d["runs"][-1].get("log_tail") for p, s in want.items()
            )
            return docs if done else None

        docs = wait_for(final, "one run FAILED and one SUCCEEDED, both with log tails", timeout=180)
        actual = json.loads(
            wait_for(
                lambda: "fails" in (a := git(repo.bare, "show", "argus/status:actual.json", check=False)) and a,
                "actual.json lists the failed job",
                timeout=60,
            )
        )
        failed = [j for j in actual["jobs"] if j["task"] == "fails"]
        assert failed and failed[0]["status"] == "FAILED"
        # Ray's message for the failed run carries its log: the attack is real, and redacted.
        assert "exit code 3" in failed[0]["message"]
        assert "plain *** ***" in failed[0]["message"] and "green *** ***" in failed[0]["message"]
        tail = "\n".join(docs[FAILING]["runs"][-1]["log_tail"])  # type: ignore[index]
        assert "plain *** ***" in tail and "HF_TOKEN=***" in tail and "title  done" in tail

        base = f"http://{daemon.listen}"
        served = [
            _get(base + path)
            for path in (
                "/",
                "/users/dora/tasks/fails",
                "/users/dora/tasks/succeeds",
                "/api/v1/summary",
                "/api/v1/objects",
                "/api/v1/objects/dora/tasks/fails",
                "/api/v1/logs/dora/tasks/fails",
                "/api/v1/logs/dora/tasks/succeeds",
                "/api/v1/deployed/dora/tasks/fails",
                "/api/v1/deployed/dora/tasks/succeeds",
            )
        ]
        assert "green ***" in served[6] and "green ***" in served[7]  # the logs were served, redacted
        everything = {
            "git": _everything_in_git(repo.bare),
            "note": repo.note(sha),
            "served": "\n".join(served),
            "daemon log": daemon.log(),
        }
        for where, text in everything.items():
            for leak in LEAKS:
                assert leak not in text, f"{leak!r} in {where}"
            assert "\x1b" not in text and "\x07" not in text, where
        # Ray itself has the values (the jobs needed them): the redaction is argus's, not luck.
        for doc in (docs[FAILING], docs[SUCCEEDS]):
            logs = Dashboard(ray_head.dashboard_url).get(f"/api/jobs/{doc['submission_id']}/logs")
            assert WANDB in logs["logs"] and HF in logs["logs"] and "\x1b[32m" in logs["logs"]
    finally:
        daemon.stop()
