"""Comments in the shipped example repository name only files and folders that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A relative path in a comment (`../schemas/x.json`, `examples/gpu-cluster/`); not URLs, `/abs`, `$HOME/...`.
PATH = re.compile(r"(?<![\w/$.:~<-])((?:\.\./)*[A-Za-z_][\w.-]*/[\w./-]*)")


def dead_references(file: Path) -> list[str]:
    """``line: path`` for each relative path in ``file``'s comments that exists neither beside the
    file nor at the repository's root."""
    out = []
    for number, line in enumerate(file.read_text().splitlines(), 1):
        for match in PATH.finditer(line.partition("#")[2]):
            rel = match.group(1)
            if not ((file.parent / rel).exists() or (ROOT / rel).exists()):
                out.append(f"{number}: {rel}")
    return out


def test_example_repository_comments_name_existing_paths() -> None:
    files = sorted((ROOT / "desired-state").rglob("*.yaml"))
    assert files
    assert {str(f.relative_to(ROOT)): dead_references(f) for f in files if dead_references(f)} == {}


def test_a_dead_reference_is_found(tmp_path: Path) -> None:
    file = tmp_path / "cluster.yaml"
    file.write_text("# see examples/gpu-cluster/ and schemas/ and $HOME/x and https://a.b/c\nkind: Cluster\n")
    assert dead_references(file) == ["1: examples/gpu-cluster/"]
