"""The status page's handler and its status-branch reader, on real git status branches."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from reconciler.testing.status_branch import commit_files, dump, model_doc, task_doc
from reconciler.web.handler import build_handler, wsgi_like
from reconciler.web.reader import StatusReader
from reconciler.web.response import Response

XSS = "<script>alert('x')</script>"


def body(resp: Response | None) -> str:
    assert resp is not None
    assert isinstance(resp.body, bytes)
    return resp.body.decode()


@pytest.fixture
def repo(tmp_path: Path) -> str:
    path = str(tmp_path / "config.git")
    subprocess.run(["git", "init", "-q", "--bare", path], check=True)
    return path


def seed(repo: str, users: int = 3) -> dict[str, bytes | None]:
    files: dict[str, bytes | None] = {}
    for u in range(users):
        user = f"u{u}"
        files[f"users/{user}/models/chat.yaml"] = dump(model_doc(user, "chat"))
        files[f"users/{user}/tasks/train.yaml"] = dump(task_doc(user, "train"))
    files["README.md"] = (
        b"# argus status\n\nDesired revision: `0123456789abcdef0123456789abcdef01234567`\n\n"
        b"## Validation errors at this revision\n\n- `users/u1/models/bad.yaml:3: replicas: expected an integer`\n"
    )
    files["actual.json"] = json.dumps(
        {
            "capacity": {"total": {"GPU": 8, "CPU": 64}, "available": {"GPU": 3, "CPU": 50}},
            "models": [{"user": "u0", "name": "chat", "replicas": 2, "resources_per_replica": {"GPU": 1, "CPU": 1}}],
            "jobs": [{"submission_id": "j", "status": "RUNNING", "resources": {"GPU": 2, "CPU": 1}}],
        }
    ).encode()
    commit_files(repo, files)
    return files


def test_reader_reads_only_changed_blobs_when_the_tip_moves(repo: str) -> None:
    seed(repo, users=20)
    reader = StatusReader(repo)
    snap = reader.snapshot()
    assert len(snap.docs) == 40 and snap.actual["capacity"]["total"]["GPU"] == 8
    cold = reader.blobs_read
    assert reader.snapshot() is snap  # same tip: nothing read, same object
    commit_files(
        repo,
        {
            "users/u3/tasks/train.yaml": dump(task_doc("u3", "train", "FAILED")),
            "users/u4/models/chat.yaml": None,
        },
    )
    snap2 = reader.snapshot()
    assert reader.blobs_read == cold + 1
    assert snap2.docs["users/u3/tasks/train.yaml"]["state"] == "FAILED"
    assert "users/u4/models/chat.yaml" not in snap2.docs and len(snap2.docs) == 39
    # unchanged documents are the same parsed objects (the page reuses their rows)
    assert snap2.docs["users/u5/models/chat.yaml"] is snap.docs["users/u5/models/chat.yaml"]


def test_reader_survives_a_rewritten_branch_and_a_missing_one(repo: str) -> None:
    reader = StatusReader(repo)
    assert reader.snapshot().tip is None and not reader.snapshot().docs
    seed(repo)
    assert len(reader.snapshot().docs) == 6
    # an unrelated history (the branch was recreated): read in full, nothing stale kept
    commit_files(repo, {"users/z/models/m.yaml": dump(model_doc("z", "m"))}, replace_all=True)
    subprocess.run(["git", "-C", repo, "update-ref", "-d", "refs/heads/argus/status"], check=True)
    commit_files(repo, {"users/z/models/m.yaml": dump(model_doc("z", "m", "FAILED"))})
    assert list(reader.snapshot().docs) == ["users/z/models/m.yaml"]
    assert reader.snapshot().docs["users/z/models/m.yaml"]["state"] == "FAILED"


def test_overview_puts_attention_first_filters_and_paginates(repo: str) -> None:
    files = seed(repo, users=5)
    files = {
        "users/u3/tasks/train.yaml": dump(task_doc("u3", "train", "FAILED", reason="exit 1")),
        "users/u4/models/chat.yaml": dump(model_doc("u4", "chat", "QUEUED", reason="needs 2 GPU, free 0 GPU")),
    }
    commit_files(repo, files)
    get = wsgi_like(build_handler(StatusReader(repo)))
    page = body(get("/"))
    assert page.index("/users/u3/tasks/train") < page.index("/users/u4/models/chat") < page.index("/users/u0/")
    assert "users/u1/models/bad.yaml:3: replicas: expected an integer" in page  # validation errors
    assert "0123456789ab" in page  # the desired revision
    only_u4 = body(get("/?user=u4"))
    assert "/users/u4/models/chat" in only_u4 and "/users/u0/" not in only_u4
    failed = body(get("/?state=FAILED"))
    assert "/users/u3/tasks/train" in failed and "/users/u4/models/chat" not in failed
    attention = body(get("/?state=attention"))
    assert "/users/u3/tasks/train" in attention and "/users/u4/models/chat" in attention
    assert "/users/u0/" not in attention
    first = json.loads(body(get("/api/v1/objects?per_page=4")))
    second = json.loads(body(get("/api/v1/objects?per_page=4&page=2")))
    assert first["total"] == 10 and first["pages"] == 3
    assert first["objects"][0]["path"] == "users/u3/tasks/train.yaml"
    assert not {o["path"] for o in first["objects"]} & {o["path"] for o in second["objects"]}
    summary = json.loads(body(get("/api/v1/summary")))
    cap = summary["capacity"]
    assert cap["total"] == {"GPU": 8.0, "CPU": 64.0}
    assert cap["models"] == {"GPU": 2.0, "CPU": 2.0} and cap["jobs"] == {"GPU": 2.0, "CPU": 1.0}
    assert cap["queued"] == {"GPU": 2.0} and cap["queued_objects"] == 1
    assert summary["errors"] == ["users/u1/models/bad.yaml:3: replicas: expected an integer"]


def test_every_user_written_string_is_escaped(repo: str) -> None:
    doc = task_doc("eve", "x", "FAILED", reason=XSS)
    doc["runs"][0].update(message=f"failed {XSS}", log_tail=["ok", f"print {XSS}"], resumed_from_step=XSS)
    doc["events"][0]["reason"] = XSS
    commit_files(repo, {"users/eve/tasks/x.yaml": dump(doc), "README.md": f"- `a.yaml:1: {XSS}`\n".encode()})
    get = wsgi_like(build_handler(StatusReader(repo)))
    for url in ("/", "/users/eve/tasks/x"):
        page = body(get(url))
        assert "<script>alert" not in page
        assert "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page
    resp = get("/users/eve/tasks/x")
    assert resp is not None and "script-src 'self'" in resp.headers["Content-Security-Policy"]


def test_object_pages_show_runs_log_tail_and_openai_example(repo: str) -> None:
    doc = task_doc("ann", "train", "FAILED")
    doc["runs"][0].update(
        message="Job entrypoint command failed with exit code 3",
        log_tail=["step 1", "boom"],
        checkpoint_step=12,
        resumed_from_step=8,
    )
    commit_files(
        repo,
        {"users/ann/tasks/train.yaml": dump(doc), "users/ann/models/chat.yaml": dump(model_doc("ann", "chat"))},
    )
    get = wsgi_like(build_handler(StatusReader(repo)))
    task = body(get("/users/ann/tasks/train"))
    assert "argus--ann--train--0123abcd" in task and "exit code 3" in task and "boom" in task
    assert "newest checkpoint: step 12; resumed from step 8" in task
    model = body(get("/users/ann/models/chat"))
    assert 'model="ann-202611300900-chat"' in model.replace("&#34;", '"')
    assert "http://127.0.0.1:8000/v1/chat/completions" in model
    api = json.loads(body(get("/api/v1/objects/ann/models/chat")))
    assert api["served_name"] == "ann-202611300900-chat"


@pytest.mark.parametrize(
    "url",
    [
        "/users/ann/models/nope",
        "/users/ann/gadgets/chat",
        "/users/../../etc/passwd",
        "/users/ann/models/..%2F..%2Fetc",
        "/users/ann/models/chat%00",
        "/static/../handler.py",
        "/api/v1/objects/ann/models/nope",
        "/api/v1/logs/ann/models/nope",
        "/api/v2/objects",
    ],
)
def test_unknown_and_traversing_paths_are_404(repo: str, url: str) -> None:
    commit_files(repo, {"users/ann/models/chat.yaml": dump(model_doc("ann", "chat"))})
    resp = wsgi_like(build_handler(StatusReader(repo)))(url)
    assert resp is not None and resp.status == 404


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH"])
def test_no_write_method_anywhere(repo: str, method: str) -> None:
    handler = build_handler(StatusReader(repo))
    for path in ("/", "/users/ann/models/chat", "/api/v1/objects"):
        resp = handler(method, path, {})
        assert resp is not None and resp.status == 405 and resp.headers["Allow"] == "GET, HEAD"


def test_git_note_of_the_attempted_revision_is_shown(repo: str, tmp_path: Path) -> None:
    work = tmp_path / "w"
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=work, check=True, capture_output=True, text=True, env={**env, "PATH": "/usr/bin:/bin"}
        ).stdout

    subprocess.run(["git", "clone", "-q", repo, str(work)], check=True, capture_output=True)
    git("commit", "-q", "--allow-empty", "-m", "desired")
    git("push", "-q", "origin", "HEAD:main")
    rev = git("rev-parse", "HEAD").strip()
    subprocess.run(
        ["git", "-C", repo, "notes", "--ref=argus", "add", "-m", f"argus: processed {rev[:12]}\n\nNotes: {XSS}", rev],
        check=True,
        env={**env, "PATH": "/usr/bin:/bin"},
    )
    commit_files(repo, {"README.md": f"Desired revision: `{rev}`\n".encode()})
    get = wsgi_like(build_handler(StatusReader(repo)))
    page = body(get("/"))
    assert f"argus: processed {rev[:12]}" in page and "&lt;script&gt;" in page
    assert json.loads(body(get("/api/v1/summary")))["revision"]["note"].startswith("argus: processed")


def test_documents_with_missing_or_odd_fields_still_render(repo: str) -> None:
    odd: dict[str, Any] = {"state": None, "replicas": "two", "runs": "none", "events": [1, None], "gpus": "x"}
    commit_files(
        repo,
        {
            "users/odd/models/m.yaml": dump(odd),
            "users/odd/tasks/t.yaml": dump({"runs": [{"status": None}, "junk"]}),
            "users/odd/tasks/broken.yaml": b"{not: [yaml",
        },
    )
    get = wsgi_like(build_handler(StatusReader(repo)))
    for url in ("/", "/users/odd/models/m", "/users/odd/tasks/t", "/api/v1/objects", "/api/v1/summary"):
        resp = get(url)
        assert resp is not None and resp.status == 200, url
    assert get("/users/odd/tasks/broken") is not None


def test_branch_level_revision_file_and_daemon_problems_are_shown(repo: str) -> None:
    root = {
        "revision": {"last_attempted": "a" * 40, "last_applied": "b" * 40},
        "subject": f"add {XSS}",
        "source_error": "git fetch failed: connection refused",
    }
    commit_files(repo, {"revision.yaml": dump(root), "users/ann/models/chat.yaml": dump(model_doc("ann", "chat"))})
    get = wsgi_like(build_handler(StatusReader(repo)))
    summary = json.loads(body(get("/api/v1/summary")))
    assert summary["revision"]["last_attempted"] == "a" * 40 and summary["revision"]["last_applied"] == "b" * 40
    page = body(get("/"))
    assert "connection refused" in page and "bbbbbbbbbbbb" in page and "add &lt;script&gt;" in page


def test_the_overview_shows_each_teams_quota_use(repo: str) -> None:
    """The per-team view (issue 20): what revision.yaml's `teams` records, escaped, also in the API."""
    teams = {
        "research": {
            "nominal": {"gpus": 4.0, "tasks": 2.0},
            "used": {"gpus": 6.0, "tasks": 2.0},
            "borrowed": {"gpus": 2.0, "tasks": 0.0},
            "lent": {"gpus": 0.0},
            "share": 0.25,
            "weight": 1.0,
        },
        XSS: {"nominal": {"gpus": "many"}, "share": "odd"},
    }
    root = {"revision": {"last_attempted": "a" * 40}, "teams": teams}
    commit_files(repo, {"revision.yaml": dump(root), "users/ann/models/chat.yaml": dump(model_doc("ann", "chat"))})
    get = wsgi_like(build_handler(StatusReader(repo)))
    page = body(get("/"))
    assert "<h2>Teams</h2>" in page and "<td>research</td><td>6 / 4</td><td>2</td>" in page
    assert XSS not in page and "&lt;script&gt;" in page
    summary = json.loads(body(get("/api/v1/summary")))
    assert [t["name"] for t in summary["teams"]] == sorted([XSS, "research"])
    assert next(t for t in summary["teams"] if t["name"] == "research")["used_slots"] == 2.0
