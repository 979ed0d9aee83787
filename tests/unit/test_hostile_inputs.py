"""Hostile inputs: every bad file gets its exact message at its exact line, and never blocks a neighbour.

File cases live in ``tests/cases/hostile/<name>.yaml``; a header of comments says where the test
puts the file and what must be reported (the header is part of the file, so lines count it)::

    # at: users/eve/tasks/x.yaml          (optional; default users/eve/models/<name>.yaml)
    # why: ...                            (optional)
    # expect: 4: replicas: 17 is greater than the maximum of 16     (line 0 = the file as a whole)

The file's issues must be exactly the expected ones (same count; each with its line and message
substring), and alice's valid model and task beside it must still load. Cases that need bytes a
text file cannot hold, a file system or a git repository are written in Python below.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from reconciler.source.directory import read_directory
from reconciler.source.git import GitRepo
from reconciler.source.localfs import LocalFS
from reconciler.spec import yamldoc
from reconciler.spec.loader import NAME_RE, USER_RE, SourceFile, classify, load
from reconciler.spec.paths import FileSystem
from reconciler.spec.types import DesiredState, ObjectKey
from reconciler.spec.yamldoc import MAX_BYTES
from tests.unit.gitrepo import WorkRepo

CASES = Path(__file__).resolve().parents[1] / "cases" / "hostile"
HEADER = re.compile(r"^# (at|why|expect): (.*)$")
EXPECT = re.compile(r"^(\d+): (.+)$")
HF_ID = "Qwen/Qwen2.5-0.5B-Instruct"

NEIGHBOUR_MODEL = ("users/alice/models/neighbour.yaml", f"kind: Model\nsource: {HF_ID}\nreplicas: 2\n")
NEIGHBOUR_TASK = (
    "users/alice/tasks/neighbour.yaml",
    f"kind: Task\nworkload: grpo\nmodel: {HF_ID}\ndata:\n  train: $HOME/data/train.parquet\n",
)
NEIGHBOUR_KEYS = (ObjectKey("alice", "model", "neighbour"), ObjectKey("alice", "task", "neighbour"))


@dataclass(frozen=True)
class Case:
    name: str
    path: str
    content: bytes
    expects: tuple[tuple[int, str], ...]


@pytest.fixture(autouse=True, params=["libyaml", "pure-python"])
def yaml_parser(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every case runs with libyaml's C parser and with the pure-Python one: same messages, same lines."""
    if request.param == "libyaml" and not yamldoc.HAS_LIBYAML:
        if os.environ.get("CI"):
            pytest.fail("PyYAML was built without libyaml")
        if os.environ.get("CI"):
            pytest.fail("PyYAML was built without libyaml", pytrace=False)
        pytest.skip("PyYAML was built without libyaml")
    monkeypatch.setattr(yamldoc, "USE_LIBYAML", request.param == "libyaml")
    return str(request.param)


def read_case(file: Path) -> Case:
    """Parse a case file's header (``# at:``, ``# why:``, ``# expect: LINE: MESSAGE``)."""
    content = file.read_bytes()
    path, expects = f"users/eve/models/{file.stem}.yaml", []
    for line in content.decode("utf-8").splitlines():
        match = HEADER.match(line)
        if not match:
            break
        field, value = match.groups()
        if field == "at":
            path = value
        elif field == "expect":
            found = EXPECT.match(value)
            assert found, f"{file.name}: bad expectation {value!r}"
            expects.append((int(found.group(1)), found.group(2)))
    assert expects, f"{file.name}: no `# expect:` line"
    return Case(file.stem, path, content, tuple(expects))


def all_cases() -> list[Case]:
    return [read_case(f) for f in sorted(CASES.glob("*.yaml"))]


def source_file(path: str, content: bytes | str) -> SourceFile:
    data = content.encode() if isinstance(content, str) else content
    return SourceFile(path, data, hashlib.sha1(data).hexdigest())


def neighbours() -> list[SourceFile]:
    return [source_file(*NEIGHBOUR_MODEL), source_file(*NEIGHBOUR_TASK)]


def load_with_neighbours(*files: SourceFile, fs: FileSystem | None = None) -> DesiredState:
    return load([*neighbours(), *files], fs=fs, default_time=1767225600)


def assert_reported(
    state: DesiredState, path: str, expects: tuple[tuple[int, str], ...] | list[tuple[int, str]]
) -> None:
    """``path``'s issues are exactly ``expects``: same count, each (line, message substring) matched once."""
    found = [i for i in state.issues if i.path == path]
    shown = "\n".join(f"  {i.line}: {i.message}" for i in found) or "  (none)"
    assert len(found) == len(expects), f"{path}: expected {len(expects)} issue(s), got:\n{shown}"
    unmatched = list(found)
    for line, message in expects:
        match = next((i for i in unmatched if i.line == line and message in i.message), None)
        assert match is not None, f"{path}: no issue at line {line} containing {message!r}; got:\n{shown}"
        unmatched.remove(match)


def assert_neighbours_load(state: DesiredState) -> None:
    assert NEIGHBOUR_KEYS[0] in state.models, state.issues
    assert NEIGHBOUR_KEYS[1] in state.tasks, state.issues
    assert not [i for i in state.issues if i.path.startswith("users/alice/")]


def test_the_corpus_is_large_enough() -> None:
    assert len(all_cases()) + len(PYTHON_CASES) >= 40
    assert len({c.path for c in all_cases() if c.path != "cluster.yaml"}) == len(
        [c for c in all_cases() if c.path != "cluster.yaml"]
    ), "two file cases share a path"


@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.name)
def test_hostile_file(case: Case) -> None:
    state = load_with_neighbours(source_file(case.path, case.content))
    assert_reported(state, case.path, case.expects)
    assert_neighbours_load(state)
    if case.path != "cluster.yaml":
        assert state.cluster_valid
        assert not (set(state.models) | set(state.tasks)) - set(NEIGHBOUR_KEYS), "a hostile file loaded"
        # A file at a good object path is an invalid object (what runs for it is kept), never an absent one.
        key, _problem = classify(case.path)
        if key is not None and USER_RE.match(key.user) and NAME_RE.match(key.name):
            assert key in state.invalid
    else:
        assert not state.cluster_valid


def test_every_error_of_every_file_in_one_run() -> None:
    """All file cases in one repository: each file's errors are all reported, in one load."""
    cases = [c for c in all_cases() if c.path != "cluster.yaml"]
    state = load_with_neighbours(*(source_file(c.path, c.content) for c in cases))
    for case in cases:
        assert_reported(state, case.path, case.expects)
    assert_neighbours_load(state)
    assert state.issues == sorted(state.issues)


# --- cases written in Python -------------------------------------------------------------------

PYTHON_CASES = [
    "empty file",
    "non-UTF-8",
    "over 256 KiB",
    "very deep nesting",
    "undeclared user",
    "symlink committed in git",
    "symlink in a directory",
    "symlink escaping the roots",
    "HF id not cached",
    "HF id resolved by refs/main",
    "HF snapshot symlink escaping",
    "missing local path",
]


def test_empty_file() -> None:
    state = load_with_neighbours(source_file("users/eve/models/empty.yaml", b""))
    assert_reported(
        state, "users/eve/models/empty.yaml", [(1, "file is empty; expected a mapping with at least `kind:`")]
    )
    assert_neighbours_load(state)


def test_non_utf8() -> None:
    content = b"kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\nenv:\n  NAME: caf\xe9\n"
    state = load_with_neighbours(source_file("users/eve/models/latin1.yaml", content))
    assert_reported(state, "users/eve/models/latin1.yaml", [(4, "file is not valid UTF-8 (byte 0xe9)")])
    assert_neighbours_load(state)


def test_utf8_bom_is_accepted() -> None:
    content = "\ufeffkind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\n".encode()
    state = load_with_neighbours(source_file("users/eve/models/bom.yaml", content))
    assert ObjectKey("eve", "model", "bom") in state.models


def test_over_256_kib() -> None:
    body = b"kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\n"
    big = body + b"#" * (MAX_BYTES - len(body) + 1)
    state = load_with_neighbours(source_file("users/eve/models/big.yaml", big))
    assert_reported(state, "users/eve/models/big.yaml", [(0, f"file is {MAX_BYTES + 1} bytes; the limit is 262144")])
    assert_neighbours_load(state)
    exact = body + b"#" * (MAX_BYTES - len(body))
    assert (
        ObjectKey("eve", "model", "ok") in load_with_neighbours(source_file("users/eve/models/ok.yaml", exact)).models
    )


def test_very_deep_nesting_does_not_crash_the_load() -> None:
    """120,000 levels fit in 256 KiB; PyYAML's recursive composer would raise RecursionError."""
    depth = 120_000
    content = b"kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\nengine_kwargs:\n  x: " + b"[" * depth + b"]" * depth
    assert len(content) < MAX_BYTES
    state = load_with_neighbours(source_file("users/eve/models/deep.yaml", content))
    assert_reported(state, "users/eve/models/deep.yaml", [(4, "nesting deeper than 64 levels is not allowed")])
    assert_neighbours_load(state)


def test_undeclared_user() -> None:
    cluster = source_file("cluster.yaml", "kind: Cluster\nusers:\n  alice: {gpus: 4}\n")
    mallory = source_file("users/mallory/models/chat.yaml", f"kind: Model\nsource: {HF_ID}\n")
    state = load_with_neighbours(cluster, mallory)
    assert_reported(state, "users/mallory/models/chat.yaml", [(0, "user 'mallory' is not declared under `users:`")])
    assert_neighbours_load(state)
    # Invalid, not absent: whatever runs for it is kept, never deleted.
    assert ObjectKey("mallory", "model", "chat") in state.invalid


def test_symlink_committed_in_git(tmp_path: Path) -> None:
    repo = WorkRepo(tmp_path / "config")
    for path, text in (NEIGHBOUR_MODEL, NEIGHBOUR_TASK):
        repo.write(path, text)
    (repo.root / "users/eve/models").mkdir(parents=True)
    (repo.root / "users/eve/models/passwd.yaml").symlink_to("/etc/passwd")
    (repo.root / "users/eve/tasks").symlink_to("../alice/tasks")
    head = repo.commit("symlinks", 1767225600)
    snap = GitRepo(str(repo.root)).snapshot(head)
    state = load(snap.files)
    message = "symlinks are not allowed in the config repository"
    assert_reported(state, "users/eve/models/passwd.yaml", [(0, message)])
    assert [str(i) for i in state.issues if i.path.startswith("users/eve/tasks")] == [
        "users/eve/tasks: files directly under users/eve/ are not allowed; put models in models/ and tasks in tasks/"
    ]
    assert_neighbours_load(state)


def test_symlink_in_a_directory(tmp_path: Path) -> None:
    """``argus validate DIR`` flags a symlinked file or folder without following it."""
    root = tmp_path / "config"
    for path, text in (NEIGHBOUR_MODEL, NEIGHBOUR_TASK):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    (root / "users/eve/models").mkdir(parents=True)
    (root / "users/eve/models/shadow.yaml").symlink_to("/etc/shadow")
    (root / "users/eve/tasks").symlink_to(root / "users/alice/tasks")
    state = load(read_directory(str(root)))
    message = "symlinks are not allowed in the config repository"
    assert_reported(state, "users/eve/models/shadow.yaml", [(0, message)])
    assert not [k for k in state.tasks if k.user == "eve"], "the symlinked folder was followed"
    assert_neighbours_load(state)


@pytest.fixture
def cluster_fs(tmp_path: Path) -> tuple[Path, SourceFile]:
    """Real roots on disk: ``<tmp>/hf`` (shared cache, holding HF_ID) and ``<tmp>/users/{alice,eve}``."""
    common, users = tmp_path / "hf", tmp_path / "users"
    snapshot = common / "hub" / "models--Qwen--Qwen2.5-0.5B-Instruct" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    for user in ("alice", "eve"):
        (users / user / "data").mkdir(parents=True)
        (users / user / "data" / "train.parquet").write_bytes(b"PAR1")
    cluster = source_file("cluster.yaml", f"kind: Cluster\npaths:\n  common: {common}\n  users: {users}\n")
    return tmp_path, cluster


def test_symlink_on_disk_escaping_the_roots(cluster_fs: tuple[Path, SourceFile]) -> None:
    tmp, cluster = cluster_fs
    outside = tmp / "outside" / "secret-weights"
    outside.mkdir(parents=True)
    (tmp / "users/eve/weights").symlink_to(outside)
    (tmp / "users/eve/shared").symlink_to(tmp / "hf" / "hub")  # into the shared cache: allowed
    (tmp / "users/eve/bobs").symlink_to(tmp / "users" / "alice")  # another user's home: refused
    escape = source_file("users/eve/models/escape.yaml", "kind: Model\nsource: $HOME/weights\n")
    inside = source_file("users/eve/models/inside.yaml", "kind: Model\nsource: $HOME/shared\n")
    other = source_file("users/eve/models/other.yaml", "kind: Model\nsource: $HOME/bobs/data\n")
    state = load_with_neighbours(cluster, escape, inside, other, fs=LocalFS())
    real = os.path.realpath(outside)
    assert_reported(
        state, escape.path, [(2, f"source: '$HOME/weights' is a symlink to {real}, outside the allowed roots")]
    )
    assert_reported(state, other.path, [(2, "source: '$HOME/bobs/data' is a symlink to ")])
    assert ObjectKey("eve", "model", "inside") in state.models
    assert_neighbours_load(state)


def test_hf_id_not_cached(cluster_fs: tuple[Path, SourceFile]) -> None:
    tmp, cluster = cluster_fs
    missing = source_file("users/eve/models/missing.yaml", "kind: Model\nsource: meta-llama/Llama-3.1-8B\n")
    state = load_with_neighbours(cluster, missing, fs=LocalFS())
    assert_reported(
        state,
        missing.path,
        [(2, f"source: 'meta-llama/Llama-3.1-8B' is not in the shared cache ({tmp / 'hf'}/hub/models--meta-llama--")],
    )
    message = next(i.message for i in state.issues if i.path == missing.path)
    assert f"download it first, e.g. `HF_HOME={tmp / 'hf'} huggingface-cli download meta-llama/Llama-3.1-8B`" in message
    assert_neighbours_load(state)
    # Offline (`argus validate --offline`) the cache is not consulted.
    assert ObjectKey("eve", "model", "missing") in load_with_neighbours(missing).models


def test_hf_id_resolves_to_the_newest_snapshot(cluster_fs: tuple[Path, SourceFile]) -> None:
    tmp, cluster = cluster_fs
    base = tmp / "hf" / "hub" / "models--org--model"
    for name, mtime in (("old111", 1_000), ("new222", 2_000), ("ref333", 1_500)):
        (base / "snapshots" / name).mkdir(parents=True)
        os.utime(base / "snapshots" / name, (mtime, mtime))
    model = source_file("users/eve/models/m.yaml", "kind: Model\nsource: org/model\n")
    key = ObjectKey("eve", "model", "m")
    # Without refs/main: the latest modified snapshot.
    state = load_with_neighbours(cluster, model, fs=LocalFS())
    assert state.models[key].source_path == str(base / "snapshots" / "new222")
    # refs/main names the snapshot huggingface_hub considers current: it wins.
    (base / "refs").mkdir()
    (base / "refs" / "main").write_text("ref333\n")
    state = load_with_neighbours(cluster, model, fs=LocalFS())
    assert state.models[key].source_path == str(base / "snapshots" / "ref333")
    assert_neighbours_load(state)


def test_hf_snapshot_symlink_escaping_the_cache(cluster_fs: tuple[Path, SourceFile]) -> None:
    tmp, cluster = cluster_fs
    outside = tmp / "elsewhere"
    outside.mkdir()
    snapshots = tmp / "hf" / "hub" / "models--evil--model" / "snapshots"
    snapshots.mkdir(parents=True)
    (snapshots / "abc").symlink_to(outside)
    model = source_file("users/eve/models/evil.yaml", "kind: Model\nsource: evil/model\n")
    state = load_with_neighbours(cluster, model, fs=LocalFS())
    real = os.path.realpath(outside)
    assert_reported(state, model.path, [(2, f"snapshots/abc is a symlink to {real}, outside the shared cache")])
    assert_neighbours_load(state)


def test_missing_local_path(cluster_fs: tuple[Path, SourceFile]) -> None:
    tmp, cluster = cluster_fs
    model = source_file("users/eve/models/gone.yaml", "kind: Model\nsource: $HOME/checkpoints/final\n")
    state = load_with_neighbours(cluster, model, fs=LocalFS())
    expected = f"source: '$HOME/checkpoints/final' ({tmp}/users/eve/checkpoints/final) does not exist"
    assert_reported(state, model.path, [(2, expected)])
    assert_neighbours_load(state)
