"""Strict YAML parsing with line numbers. Pure (takes bytes).

``yaml.safe_load`` semantics, stricter: one mapping document, no duplicate keys, no
aliases (they are how "billion laughs" bombs expand), UTF-8 only, at most 256 KiB.
Every value's line is recorded so schema errors can be reported as ``path:line``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from reconciler.errors import Issue

MAX_BYTES = 256 * 1024
MAX_DEPTH = 64  # nesting levels of mappings and lists
JsonPath = tuple[str | int, ...]


@dataclass
class Document:
    """A parsed YAML mapping and the line (1-based) of every key and item in it."""

    path: str
    data: dict[str, Any]
    lines: dict[JsonPath, int] = field(default_factory=dict)

    def line(self, where: Sequence[str | int] = ()) -> int:
        """Line of ``where``, or of its nearest recorded ancestor (1 for the document)."""
        key = tuple(where)
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key[:-1]
        return self.lines.get((), 1)


class YamlError(Exception):
    def __init__(self, issue: Issue) -> None:
        super().__init__(str(issue))
        self.issue = issue


class _StrictLoader(yaml.SafeLoader):  # type: ignore[misc]
    """A SafeLoader whose composer refuses aliases (and therefore alias bombs) and deep nesting
    (PyYAML's composer recurses per level: ``[[[[...`` would raise RecursionError)."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.MarkedYAMLError(
                None, None, "YAML aliases (*name) are not allowed in argus files; write the value out", event.start_mark
            )
        if self._depth >= MAX_DEPTH:
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.MarkedYAMLError(
                None, None, f"nesting deeper than {MAX_DEPTH} levels is not allowed", event.start_mark
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse(path: str, content: bytes) -> Document:
    """Parse one file. Returns a :class:`Document`; raises :class:`YamlError` with a located Issue."""
    if len(content) > MAX_BYTES:
        raise YamlError(Issue(path, 0, f"file is {len(content)} bytes; the limit is {MAX_BYTES} (256 KiB)"))
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = content[: exc.start].count(b"\n") + 1
        raise YamlError(Issue(path, line, f"file is not valid UTF-8 (byte 0x{content[exc.start]:02x})")) from exc
    if text.startswith("\ufeff"):
        text = text[1:]
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise YamlError(Issue(path, 1, "file is empty; expected a mapping with at least `kind:`"))
        doc = Document(path, {})
        data = _convert(node, (), doc, loader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 0
        problem = exc.problem or str(exc)
        if "expected a single document" in str(exc):
            problem = "only one YAML document per file is allowed (found a second `---` document)"
        raise YamlError(Issue(path, line, f"invalid YAML: {problem}")) from exc
    except yaml.YAMLError as exc:
        raise YamlError(Issue(path, 0, f"invalid YAML: {exc}")) from exc
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        names = {"int": "an integer", "float": "a number", "bool": "a boolean", "str": "a string"}
        kind = "a list" if isinstance(data, list) else names.get(type(data).__name__, f"a {type(data).__name__}")
        raise YamlError(
            Issue(path, node.start_mark.line + 1, f"the document is {kind}; expected a mapping (key: value)")
        )
    doc.data = data
    doc.lines[()] = node.start_mark.line + 1
    return doc


_PLAIN_TAGS: dict[type[Node], str] = {SequenceNode: "tag:yaml.org,2002:seq", MappingNode: "tag:yaml.org,2002:map"}


def _convert(node: Node, where: JsonPath, doc: Document, loader: yaml.SafeLoader) -> Any:
    doc.lines.setdefault(where, node.start_mark.line + 1)
    if isinstance(node, ScalarNode):
        return loader.construct_object(node, deep=True)
    if type(node) in _PLAIN_TAGS and node.tag != _PLAIN_TAGS[type(node)]:
        # safe_load would refuse `!!python/...` on a list or mapping (or build a set/omap); never ignore a tag.
        raise YamlError(Issue(doc.path, node.start_mark.line + 1, f"invalid YAML: the tag {node.tag!r} is not allowed"))
    if isinstance(node, SequenceNode):
        return [_convert(item, (*where, i), doc, loader) for i, item in enumerate(node.value)]
    if isinstance(node, MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == "tag:yaml.org,2002:merge":
                raise YamlError(Issue(doc.path, line, "YAML merge keys (<<) are not allowed"))
            if not isinstance(key_node, ScalarNode):
                raise YamlError(Issue(doc.path, line, "mapping keys must be plain strings"))
            key = loader.construct_object(key_node)
            if not isinstance(key, str):
                # `1: x` or `true: x` would be silently retyped by YAML; keys must be names.
                key = str(key_node.value)
            if key in out:
                first = doc.lines.get((*where, key), 0)
                raise YamlError(Issue(doc.path, line, f"duplicate key {key!r} (first defined on line {first})"))
            doc.lines[(*where, key)] = line
            out[key] = _convert(value_node, (*where, key), doc, loader)
            doc.lines[(*where, key)] = line
        return out
    raise YamlError(Issue(doc.path, node.start_mark.line + 1, f"unsupported YAML node {node.tag}"))
