"""The manual stays true to the tree: every relative link in README.md and docs/**.md resolves
(files, folders and heading anchors), and every ``make X`` and ``argus X`` shown in code exists
(a Makefile target; a subcommand of argus's argparse parser)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reconciler.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").rglob("*.md")])
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
# A command starts a line of code (after an optional `$ ` prompt) or follows a shell operator;
# `argus` may be a path (`.venv/bin/argus`). Comments are dropped first (see commands()).
MAKE = re.compile(r"(?:^\s*(?:\$\s+)?|[;&|(]\s*)make ([a-z][\w-]*)")
ARGUS = re.compile(r"(?:^\s*(?:\$\s+)?|[;&|(]\s*)(?:\S*/)?argus ([a-z][\w-]*)")


def split(text: str) -> tuple[list[str], list[str]]:
    """(prose lines, code snippets): fenced blocks and inline code are code; links live in prose."""
    prose: list[str] = []
    code: list[str] = []
    fenced = False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            code.append(line)
        else:
            code.extend(INLINE_CODE.findall(line))
            prose.append(INLINE_CODE.sub("", line))
    return prose, code


def commands(code: list[str], pattern: re.Pattern[str]) -> list[str]:
    """What ``pattern`` finds in the code lines, comments (`# ...`) dropped."""
    return [name for line in code for name in pattern.findall(re.sub(r"(^|\s)#.*$", "", line))]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in page.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6} (.+)$", line)):
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    prose, _ = split(page.read_text())
    out = []
    for target in (t for line in prose for t in LINK.findall(line)):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:
        file, _, fragment = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        shown = dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest
        if not dest.exists():
            out.append(f"{target}: no such file {shown}")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            out.append(f"{target}: no heading #{fragment} in {shown}")
    return out


def make_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return {m.group(1) for m in re.finditer(r"^([A-Za-z][\w-]*)\s*:(?!=)", text, re.M)}


def argus_commands() -> set[str]:
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return set(subparsers.choices)  # type: ignore[attr-defined]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    assert broken_links(page) == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_shown_exists(page: Path) -> None:
    _, code = split(page.read_text())
    targets, subcommands = make_targets(), argus_commands()
    missing = [f"make {t}" for t in commands(code, MAKE) if t not in targets]
    missing += [f"argus {s}" for s in commands(code, ARGUS) if s not in subcommands]
    assert missing == []


def test_the_checks_catch_what_they_check(tmp_path: Path) -> None:
    """A dead link, a dead anchor and an unknown command are found (the checks can fail)."""
    page = tmp_path / "p.md"
    page.write_text("# Title\n[a](missing.md) [b](#nowhere) [c](#title) [d](https://x.example/y)\n")
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "#nowhere"]
    _, code = split("run `make nonsense` and `argus frobnicate x`\n```\n$ .venv/bin/argus validate . # argus x\n```\n")
    assert commands(code, MAKE) == ["nonsense"] and "nonsense" not in make_targets()
    assert commands(code, ARGUS) == ["frobnicate", "validate"] and "frobnicate" not in argus_commands()
    assert "validate" in argus_commands() and {"demo", "test"} <= make_targets()


def test_the_manual_has_its_pages() -> None:
    """The README is an overview; the manual's sections exist."""
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250
    for folder in ("users", "admins", "reference", "design"):
        assert list((ROOT / "docs" / folder).glob("*.md")), folder
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License")
