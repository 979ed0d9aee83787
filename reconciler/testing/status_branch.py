"""Write a status branch directly (tests and the bench): one commit with ``git fast-import``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from reconciler import git


def commit_files(
    repo: str,
    files: Mapping[str, bytes | None],
    *,
    branch: str = "argus/status",
    message: str = "argus: test status",
    replace_all: bool = False,
) -> str:
    """Commit ``files`` (path -> content; None deletes the path) on ``branch`` of ``repo``.

    The commit's parent is the branch's tip (when it exists); with ``replace_all`` the tree
    holds exactly ``files``. Returns the new commit id.
    """
    ref = f"refs/heads/{branch}"
    parent = git.rev(repo, ref)
    msg = message.encode()
    out = [
        f"commit {ref}\n".encode(),
        b"mark :1\n",
        b"committer argus <argus@localhost> 1764500000 +0000\n",
        f"data {len(msg)}\n".encode() + msg + b"\n",
    ]
    if parent:
        out.append(f"from {parent}\n".encode())
    if replace_all:
        out.append(b"deleteall\n")
    for path, data in sorted(files.items()):
        if data is None:
            out.append(f"D {path}\n".encode())
        else:
            out.append(f"M 100644 inline {path}\ndata {len(data)}\n".encode() + data + b"\n")
    out.append(b"done\n")
    git.run(repo, "fast-import", "--quiet", "--done", "--force", input=b"".join(out))
    return git.text(repo, "rev-parse", ref)


def dump(doc: Mapping[str, Any]) -> bytes:
    return yaml.safe_dump(dict(doc), sort_keys=False, allow_unicode=True, width=1000).encode()


def model_doc(user: str, name: str, state: str = "RUNNING", **extra: Any) -> dict[str, Any]:
    """A model's status document in the shape the daemon writes."""
    doc: dict[str, Any] = {
        "object": f"{user}/models/{name}",
        "kind": "Model",
        "state": state,
        "sync": "Synced",
        "reason": "",
        "served_name": f"{user}-202611300900-{name}",
        "endpoint": "http://127.0.0.1:8000/v1",
        "replicas": {"desired": 1, "ready": 1 if state == "RUNNING" else 0},
        "gpus": 1.0,
        "last_transition": "2026-11-30T09:00:00Z",
        "events": [{"time": "2026-11-30T09:00:00Z", "state": state, "sync": "Synced", "reason": ""}],
    }
    doc.update(extra)
    return doc


def task_doc(user: str, name: str, state: str = "SUCCEEDED", **extra: Any) -> dict[str, Any]:
    """A task's status document in the shape the daemon writes (one run)."""
    sid = f"argus--{user}--{name}--0123abcd"
    doc: dict[str, Any] = {
        "object": f"{user}/tasks/{name}",
        "kind": "Task",
        "state": state,
        "sync": "Synced",
        "reason": "",
        "submission_id": sid,
        "gpus": 0.0,
        "last_transition": "2026-11-30T09:00:00Z",
        "runs": [
            {
                "submission_id": sid,
                "status": state,
                "start_time": "2026-11-30T08:50:00Z",
                "end_time": "2026-11-30T09:00:00Z",
            }
        ],
        "events": [{"time": "2026-11-30T09:00:00Z", "state": state, "sync": "Synced", "reason": ""}],
    }
    doc.update(extra)
    return doc
