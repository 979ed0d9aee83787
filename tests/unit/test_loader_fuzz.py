"""The loader never raises, whatever the file names and bytes, with either YAML parser.

Generated repositories: random paths under ``users/`` (any characters, lone surrogates as git
names that are not UTF-8 decode to), random bytes or YAML-shaped text of every type, beside
two valid files. Properties: ``load`` returns; the valid files load as they do alone; every
issue prints on one line; every object key (loaded, invalid or held) has valid names.
"""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reconciler.spec import yamldoc
from reconciler.spec.loader import NAME_RE, USER_RE, SourceFile, load
from reconciler.spec.types import ObjectKey

GOOD = {
    "users/alice/models/chat.yaml": b"kind: Model\nsource: Qwen/Qwen2.5-0.5B-Instruct\nengine_kwargs: {a: 1}\n",
    "users/alice/tasks/train.yaml": (
        b"kind: Task\nworkload: grpo\nmodel: Qwen/Qwen2.5-0.5B-Instruct\ndata:\n  train: $HOME/data/t.parquet\n"
    ),
}
GOOD_KEYS = {ObjectKey("alice", "model", "chat"), ObjectKey("alice", "task", "train")}

segment = st.one_of(
    st.sampled_from(["eve", "models", "tasks", "chat.yaml", "x.yml", ".gitkeep", "a b", "Chat", "chat\n"]),
    st.text(min_size=1, max_size=12).filter(lambda s: "/" not in s and "\0" not in s),
    st.binary(min_size=1, max_size=8)
    .filter(lambda b: b"/" not in b and b"\0" not in b)
    .map(lambda b: b.decode("utf-8", "surrogateescape")),
)
path = st.lists(segment, min_size=1, max_size=4).map(lambda parts: "users/" + "/".join(parts))
scalar = st.one_of(
    st.sampled_from(
        [
            "2026-01-01",
            "2026-01-01 10:00:00",
            "!!binary aGk=",
            ".nan",
            "-.inf",
            "~",
            "yes",
            "0x1F",
            "!!int x",
            "*a",
            "&a 1",
            "!!python/name:os.system",
            "'q'",
            '"\\x01"',
            "{a: 1, a: 2}",
            "[1, [2, [3]]]",
            "<<: {a: 1}",
        ]
    ),
    st.text(max_size=8),
)
yaml_text = st.lists(
    st.tuples(
        st.sampled_from(["kind", "source", "replicas", "engine_kwargs", "env", "workload", "x", "  y", "- z"]),
        scalar,
    ),
    max_size=6,
).map(lambda items: "".join(f"{k}: {v}\n" for k, v in items).encode("utf-8", "surrogateescape"))
content = st.one_of(yaml_text, st.binary(max_size=64))


@pytest.mark.parametrize("libyaml", [True, False], ids=["libyaml", "pure-python"])
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.dictionaries(path, content, max_size=6))
def test_load_never_raises(monkeypatch: pytest.MonkeyPatch, libyaml: bool, files: dict[str, bytes]) -> None:
    monkeypatch.setattr(yamldoc, "USE_LIBYAML", libyaml and yamldoc.HAS_LIBYAML)
    files = {p: c for p, c in files.items() if p not in GOOD}
    sources = [
        SourceFile(p, c, hashlib.sha1(p.encode("utf-8", "surrogateescape") + c).hexdigest()) for p, c in files.items()
    ]
    sources += [SourceFile(p, c, hashlib.sha1(c).hexdigest()) for p, c in GOOD.items()]
    state = load(sources, default_time=1767225600)
    assert set(state.models) | set(state.tasks) >= GOOD_KEYS
    assert not [i for i in state.issues if i.path in GOOD]
    for issue in state.issues:
        assert str(issue).isprintable(), repr(str(issue))
    for key in (*state.models, *state.tasks, *state.invalid):
        assert USER_RE.fullmatch(key.user) and NAME_RE.fullmatch(key.name), key
