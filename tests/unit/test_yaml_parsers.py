"""libyaml's C parser and the pure-Python strict parser give the same result for every input.

``reconciler.spec.yamldoc`` composes with libyaml when it can and falls back to the pure-Python
parser for anything the C path does not accept; these tests hold the two to the same data, the
same lines and the same ``path:line`` errors, over every file the tests ship and thousands of
seeded random mutations of them.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import pytest

from reconciler.spec import yamldoc
from reconciler.spec.yamldoc import MAX_DEPTH, YamlError, parse

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted(
    [
        *(ROOT / "tests" / "cases" / "hostile").glob("*.yaml"),
        *(ROOT / "tests" / "cases" / "planner").rglob("*.yaml"),
        *(ROOT / "desired-state").rglob("*.yaml"),
    ]
)
# Characters that change YAML structure, and a few that make ordinary values.
ALPHABET = ":-[]{}#&*!|>'\"\n\t ,?%@`<=~.0123456789abcxyz\\\u00e9\u2028"
MUTANTS = 4000


@pytest.fixture(autouse=True)
def _needs_libyaml() -> None:
    if not yamldoc.HAS_LIBYAML:
        if os.environ.get("CI"):
            pytest.fail("PyYAML was built without libyaml")
        if os.environ.get("CI"):
            pytest.fail("PyYAML was built without libyaml", pytrace=False)
        pytest.skip("PyYAML was built without libyaml")


def outcome(content: bytes, libyaml: bool) -> tuple[str, Any]:
    """What parsing gives, in a comparable form (repr: NaN != NaN, and types must agree too)."""
    try:
        doc = parse("f.yaml", content, libyaml=libyaml)
    except YamlError as exc:
        return "error", str(exc.issue)
    return "ok", (repr(doc.data), sorted(doc.lines.items(), key=repr), repr(doc.not_json), repr(doc.written))


def assert_same(content: bytes) -> tuple[str, Any]:
    c, py = outcome(content, True), outcome(content, False)
    assert c == py, f"parsers disagree on {content!r}:\n  libyaml: {c}\n  python:  {py}"
    return c


def test_every_shipped_file_parses_the_same() -> None:
    assert len(SOURCES) > 100
    kinds = {assert_same(path.read_bytes())[0] for path in SOURCES}
    assert kinds == {"ok", "error"}


def test_random_mutations_parse_the_same() -> None:
    rng = random.Random(20261130)
    texts = [path.read_bytes().decode("utf-8") for path in SOURCES]
    results = {"ok": 0, "error": 0}
    for _ in range(MUTANTS):
        text = rng.choice(texts)
        for _ in range(rng.randint(1, 4)):
            pos = rng.randrange(len(text) + 1)
            action = rng.random()
            if action < 0.4:
                text = text[:pos] + rng.choice(ALPHABET) + text[pos:]
            elif action < 0.7:
                text = text[:pos] + text[pos + 1 :]
            elif action < 0.85:  # shift a line's indentation
                start = text.rfind("\n", 0, pos) + 1
                text = text[:start] + rng.choice(["  ", " ", "\t", ""]) + text[start:].lstrip(" ")
            else:  # repeat a line (duplicate keys, second documents)
                start, end = text.rfind("\n", 0, pos) + 1, text.find("\n", pos)
                line = text[start : end if end >= 0 else len(text)]
                text = text[:start] + line + "\n" + text[start:]
        results[assert_same(text.encode("utf-8"))[0]] += 1
    # Both outcomes are common: the mutations test acceptance and errors alike.
    assert results["ok"] > MUTANTS // 10 and results["error"] > MUTANTS // 10, results


@pytest.mark.parametrize(
    "text",
    [
        "kind: Model\nsource: a\nengine_kwargs: {x: &a [1, 2], y: *a}\n",  # alias of a list
        "kind: Model\nsource: &s a\nengine_kwargs: {x: *s}\n",  # alias of a scalar
        "kind: Model\nsource: a\nengine_kwargs: &e {x: *e}\n",  # a recursive alias
        "kind: Model\nsource: a\nengine_kwargs: &e {x: 1}\n",  # an anchor alone is fine
        "kind: Model\nx: " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n",
        "kind: Model\nx: " + "[" * (MAX_DEPTH - 2) + "1" + "]" * (MAX_DEPTH - 2) + "\n",
        "kind: Model\nx: " + "[" * 1500 + "]" * 1500 + "\n",  # within the C budget, beyond MAX_DEPTH
        "kind: Model\nx: " + "[" * 30000 + "]" * 30000 + "\n",  # would overflow the C stack
        "kind: Model\nx: " + "- " * (MAX_DEPTH + 3) + "a\n",
        "",
        "# only a comment\n",
        "---\nkind: Model\n---\nkind: Task\n",
        "kind: Model\nx: \x01\n",
        "kind: Model\nx: a\u2028b\n",
        "kind: Model\n<<: {a: 1}\n",
        "kind: Model\n? [a]\n: b\n",
        "kind: Model\nx: !!python/object:os.system {}\n",
        "kind: Model\nx: !!python/name:os.system\n",
        "kind: Model\nx: !custom 1\n",
        "kind: Model\nx: !!int 0x1F\ny: !!float 1e3\nz: 0o17\nw: 1_000\n",
        "kind: Model\nt: 2026-01-01 10:00:00+02:00\nd: 2026-01-01\nb: !!binary aGVsbG8=\n",
        "kind: Model\nn: [.nan, .inf, -.Inf, .NaN]\n",
        "kind: Model\nyes: no\non: off\n1: 2\n~: null\n",
        "kind: Model\nx: |\n  a\n   b\nz: >-\n  c\n  d\n",
        "kind: Model\nx: 'it''s'\ny: \"\\u00e9\\x41\\n\"\n",
    ],
)
def test_edge_cases_parse_the_same(text: str) -> None:
    assert_same(text.encode("utf-8"))


def test_valid_files_take_the_c_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A valid file is parsed by libyaml alone (the pure-Python parser is never called)."""

    def refuse(path: str, text: str) -> yamldoc.Document:
        raise AssertionError(f"{path} fell back to the pure-Python parser")

    valid = [p for p in SOURCES if outcome(p.read_bytes(), False)[0] == "ok"]
    assert len(valid) > 50
    monkeypatch.setattr(yamldoc, "_parse_python", refuse)
    for path in valid:
        if yamldoc._c_safe(path.read_text("utf-8")):
            parse(str(path), path.read_bytes(), libyaml=True)


@pytest.mark.parametrize("libyaml", [True, False])
def test_documents_share_keys_values_and_paths_within_a_bound(libyaml: bool) -> None:
    """Two files share their short keys, values and key paths (memory at 100,000 objects); a
    hostile file of thousands of distinct or long keys cannot grow the shared path table."""
    text = b"kind: Model\nsource: $HOME/models/m\nengine_kwargs:\n  max_model_len: 4096\n"
    a, b = parse("users/a/models/m.yaml", text, libyaml=libyaml), parse("users/b/models/m.yaml", text, libyaml=libyaml)
    assert a.data == b.data and a.lines == b.lines
    assert next(iter(a.data)) is next(iter(b.data)) and a.data["source"] is b.data["source"]
    assert [id(k) for k in a.lines] == [id(k) for k in b.lines]
    long = "k" * (yamldoc.SHARE_MAX_CHARS + 1)
    many = "".join(f"x{i}: {i}\n" for i in range(2 * yamldoc._PATHS_MAX))
    hostile = many + f"{long}: 1\n{long[:-1]}y:\n  {long}: 2\n"
    doc = parse("users/a/models/h.yaml", hostile.encode(), libyaml=libyaml)
    assert doc.data[long] == 1 and doc.lines[(long,)] == 2 * yamldoc._PATHS_MAX + 1
    assert len(yamldoc._PATHS) <= yamldoc._PATHS_MAX
    assert not any(len(str(p)) > yamldoc.SHARE_MAX_CHARS for path in yamldoc._PATHS for p in path)
