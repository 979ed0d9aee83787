"""Strict YAML parsing with line numbers. Pure (takes bytes).

``yaml.safe_load`` semantics, stricter: one mapping document, no duplicate keys, no
aliases (they are how "billion laughs" bombs expand), UTF-8 only, at most 256 KiB.
Every value's line is recorded so schema errors can be reported as ``path:line``.

Two parsers, one result. When PyYAML has libyaml, a file is composed to a node tree by the
C parser (``CSafeLoader``) and that tree is walked here, checking what the pure-Python
composer below refuses as it goes (aliases, nesting) besides what both check (duplicate and
merge keys, tags, types). The C path only ever *accepts*: on any problem, or on input where
the two parsers could differ (characters PyYAML's reader refuses, nesting deep enough to
exhaust the C stack), the file is parsed again by the pure-Python strict parser, whose
``path:line`` message is reported. So every error is the same with or without libyaml.
"""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import Reader

from reconciler.errors import Issue
from reconciler.errors import YamlError as YamlError  # raised here; callers catch it from here
from reconciler.redact import SURROGATE

# None when PyYAML was built without libyaml.
_CSafeLoader: type[Any] | None = getattr(yaml, "CSafeLoader", None)

MAX_BYTES = 256 * 1024
MAX_DEPTH = 64  # nesting levels of mappings and lists
HAS_LIBYAML = _CSafeLoader is not None
USE_LIBYAML = HAS_LIBYAML  # parse() default; tests flip it to check that both parsers agree
# The C composer recurses in C once per nesting level: 30,000 levels overflowed an 8 MiB stack
# in a test. A document nests at most once per `[`, `{`, `-`, `:` or `?` (every collection holds
# one), so below this count the C parser is safe even on a thread's smaller stack.
C_MAX_INDICATORS = 2000
JsonPath = tuple[str | int, ...]

_STR = "tag:yaml.org,2002:str"
_MERGE = "tag:yaml.org,2002:merge"
_PLAIN_TAGS: dict[type[Node], str] = {SequenceNode: "tag:yaml.org,2002:seq", MappingNode: "tag:yaml.org,2002:map"}
# The scalar constructors safe_load uses, called directly (construct_object's bookkeeping is
# for recursive collections, which scalars are not).
_SCALARS: dict[str, Callable[[Any, ScalarNode], Any]] = {
    tag: yaml.SafeLoader.yaml_constructors[tag]
    for tag in (
        "tag:yaml.org,2002:null",
        "tag:yaml.org,2002:bool",
        "tag:yaml.org,2002:int",
        "tag:yaml.org,2002:float",
        "tag:yaml.org,2002:binary",
        "tag:yaml.org,2002:timestamp",
    )
}
_JSON_SCALARS = (str, int, bool, type(None))
# Memory at 100,000 objects (every parsed document stays in the parse cache): the same keys,
# short values and key paths recur in every file, so they are shared, not held once per file.
# Strings go through sys.intern (mortal: freed with the last document holding them); key paths
# of short names are kept in a table bounded in entries and in name length, so no input can
# grow it past a few hundred KB.
SHARE_MAX_CHARS = 64
_PATHS_MAX = 4096
_PATHS: dict[JsonPath, JsonPath] = {}


@dataclass
class Document:
    """A parsed YAML mapping and the line (1-based) of every key and item in it.

    ``not_json`` lists the values that JSON cannot carry (dates, binary, NaN, infinity) with
    where they are: the schema check reports them where a JSON value is required.
    ``written`` holds, by where it is, the text of every scalar that YAML read as something
    other than a string and that reads back differently (``yes`` -> true, ``1.10`` -> 1.1,
    ``2026-01-02`` -> a date, ``12:30`` -> 750): an error then shows what the user wrote.
    """

    path: str
    data: dict[str, Any]
    lines: dict[JsonPath, int] = field(default_factory=dict)
    not_json: list[tuple[JsonPath, Any]] = field(default_factory=list)
    written: dict[JsonPath, str] = field(default_factory=dict)

    def line(self, where: Sequence[str | int] = ()) -> int:
        """Line of ``where``, or of its nearest recorded ancestor (1 for the document)."""
        key = tuple(where)
        while key:
            if key in self.lines:
                return self.lines[key]
            key = key[:-1]
        return self.lines.get((), 1)


class _Retry(Exception):
    """The C path met something only the pure-Python parser reports exactly: parse again there."""


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


def parse(path: str, content: bytes, *, libyaml: bool | None = None) -> Document:
    """Parse one file. Returns a :class:`Document`; raises :class:`YamlError` with a located Issue.

    ``libyaml`` chooses the parser (default :data:`USE_LIBYAML`); the result is the same.
    """
    if len(content) > MAX_BYTES:
        raise YamlError(Issue(path, 0, f"file is {len(content)} bytes; the limit is {MAX_BYTES} (256 KiB)"))
    try:
        text = content.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = content[: exc.start].count(b"\n") + 1
        raise YamlError(Issue(path, line, f"file is not valid UTF-8 (byte 0x{content[exc.start]:02x})")) from exc
    if text.startswith("\ufeff"):
        text = text[1:]
    if (USE_LIBYAML if libyaml is None else libyaml) and _CSafeLoader is not None and _c_safe(text):
        try:
            return _parse_c(path, text)
        except (_Retry, YamlError, yaml.YAMLError):
            pass  # the pure-Python parser says exactly what is wrong
    return _parse_python(path, text)


def _c_safe(text: str) -> bool:
    """Whether libyaml may compose ``text``: shallow enough for the C stack, and only characters
    PyYAML's reader accepts (libyaml's own check is the same set, but one regex pass is cheap)."""
    indicators = text.count("[") + text.count("{") + text.count("-") + text.count(":") + text.count("?")
    return (
        indicators <= C_MAX_INDICATORS
        # libyaml accepts tabs where PyYAML refuses them (`key: <TAB>value`) and `?` inside plain
        # scalars of flow collections (`{a?: 1}`): leave those characters to PyYAML.
        and "\t" not in text
        and "?" not in text
        and Reader.NON_PRINTABLE.search(text) is None
    )


def _parse_c(path: str, text: str) -> Document:
    assert _CSafeLoader is not None
    loader = _CSafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise _Retry
        doc = Document(path, {})
        # Aliases need an anchor (`&`); without one no node can be shared and the check is skipped.
        seen: set[int] | None = set() if "&" in text else None
        data = _Walk(doc, loader, seen).convert(node, (), 0)
    finally:
        loader.dispose()
    return _finish(doc, data, node)


def _parse_python(path: str, text: str) -> Document:
    bad = Reader.NON_PRINTABLE.search(text)
    if bad is not None:  # PyYAML's reader would raise an unlocated ReaderError
        line = text.count("\n", 0, bad.start()) + 1
        char = bad.group()
        raise YamlError(Issue(path, line, f"invalid YAML: the character {char!r} (#x{ord(char):04x}) is not allowed"))
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise YamlError(Issue(path, 1, "file is empty; expected a mapping with at least `kind:`"))
        doc = Document(path, {})
        data = _Walk(doc, loader, None).convert(node, (), 0)
    except yaml.MarkedYAMLError as exc:
        raise YamlError(_syntax_issue(path, text, exc)) from exc
    except yaml.YAMLError as exc:
        raise YamlError(Issue(path, 0, f"invalid YAML: {exc}")) from exc
    finally:
        loader.dispose()
    return _finish(doc, data, node)


def _syntax_issue(path: str, text: str, exc: yaml.MarkedYAMLError) -> Issue:
    """``exc`` as a located Issue in plain words, with what to do about it.

    PyYAML's own text (``mapping values are not allowed here``) names the parser's state, not the
    user's mistake, and for an unclosed quote or a missing ``:`` it points at the line *after*
    the mistake (where the parser noticed): the first mistakes of new users are recognised here
    and reported at the line that holds them. Anything else keeps the parser's short problem text.
    """
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else 0
    column = mark.column + 1 if mark is not None else 0
    problem = exc.problem or str(exc)
    context = exc.context or ""
    lines = text.split("\n")
    if "expected a single document" in str(exc):
        problem = "only one YAML document per file is allowed (found a second `---` document)"
    elif "'\\t' that cannot start any token" in problem and mark is not None:
        before = lines[mark.line][: mark.column] if mark.line < len(lines) else ""
        if not before.strip():
            problem = "a tab indents this line; YAML indents with spaces only: replace the tab with spaces"
        else:
            problem = "a tab here is not allowed outside quotes; use spaces, or quote the value"
    elif "that cannot start any token" in problem and mark is not None:
        char = problem.split("'")[1] if problem.count("'") >= 2 else "this character"
        problem = f'a value cannot start with {char} unless it is quoted; quote the value ("{char}...")'
    elif "could not find expected ':'" in problem and exc.context_mark is not None:
        # The parser reads on to the next line looking for the colon; the key is where it started.
        line, column = exc.context_mark.line + 1, exc.context_mark.column + 1
        held = lines[exc.context_mark.line] if exc.context_mark.line < len(lines) else ""
        if re.search(r":[^\s]", held) and ": " not in held:
            problem = "a `:` must be followed by a space (`key: value`)"
        else:
            problem = "this line is not `key: value`: a `:` is missing (write `key: value`, a space after the colon)"
    elif "quoted scalar" in context and exc.context_mark is not None and "end of stream" in problem:
        line, column = exc.context_mark.line + 1, exc.context_mark.column + 1
        quote = _char_at(lines, exc.context_mark.line, exc.context_mark.column) or "quote"
        problem = f"the {quote} quote opened here is never closed; add the closing {quote} at the end of the value"
    elif "unknown escape character" in problem:
        problem = (
            f'{problem.split("character", 1)[1].strip()} after a backslash is not an escape in a "double-quoted" '
            "value; write the value in 'single quotes' (or write \\\\ for a backslash)"
        )
    elif problem == "mapping values are not allowed here" and mark is not None:
        held = lines[mark.line] if mark.line < len(lines) else ""
        if ": " in held[: mark.column] or held[: mark.column].rstrip().endswith(":"):
            problem = "a value holds `: ` (a colon and a space); quote the value"
        else:
            problem = (
                "this key is indented more than the keys above it: indent it like the keys it belongs with "
                "(or, if it belongs under the key above, that key must have no value on its own line)"
            )
    elif problem.startswith("expected <block end>, but found") and mark is not None:
        found = problem.split("found", 1)[1].strip()
        if found == "'<scalar>'":
            problem = "text follows a quoted value; quote the whole value, or remove the quotes"
        elif found == "'-'":
            problem = "a list item (`- `) where a key was expected: indent the items under their key"
        else:
            problem = (
                "bad indentation: this line is indented to a level no line above it uses; indent it "
                "like the keys (or list items) it belongs with"
            )
    elif "found unhashable key" in problem:
        problem = "a value starting with `{` is read as a YAML mapping; quote the value"
    elif context.startswith("while parsing a flow") and exc.context_mark is not None:
        line, column = exc.context_mark.line + 1, exc.context_mark.column + 1
        opened = _char_at(lines, exc.context_mark.line, exc.context_mark.column) or "bracket"
        close = {"[": "]", "{": "}"}.get(opened, "the bracket")
        problem = (
            f"the {opened} opened here is not closed with {close} (or its items are not separated by `,`); "
            f"if the value is not a YAML list or mapping, quote it"
        )
    return Issue(path, line, f"invalid YAML: {problem}", column)


def _char_at(lines: list[str], line: int, column: int) -> str | None:
    """The character at 0-based ``line`` and ``column`` of ``lines``, or None."""
    held = lines[line] if line < len(lines) else ""
    return held[column] if column < len(held) else None


def _finish(doc: Document, data: Any, node: Node) -> Document:
    if not isinstance(data, dict):
        names = {"int": "an integer", "float": "a number", "bool": "a boolean", "str": "a string"}
        kind = "a list" if isinstance(data, list) else names.get(type(data).__name__, f"a {type(data).__name__}")
        raise YamlError(
            Issue(doc.path, node.start_mark.line + 1, f"the document is {kind}; expected a mapping (key: value)")
        )
    doc.data = data
    doc.lines[()] = node.start_mark.line + 1
    return doc


class _Walk:
    """Node tree -> Python data, recording lines; refuses what argus files may not hold.

    ``seen`` (C path only) collects the ids of visited collections and anchored scalars: a node
    met twice is an alias, which the C composer resolves silently.
    """

    def __init__(self, doc: Document, loader: Any, seen: set[int] | None) -> None:
        self.doc, self.loader, self.seen = doc, loader, seen

    def convert(self, node: Node, where: JsonPath, depth: int) -> Any:
        doc = self.doc
        doc.lines.setdefault(where, node.start_mark.line + 1)
        if self.seen is not None:
            if id(node) in self.seen:
                raise _Retry  # an alias
            self.seen.add(id(node))
        if depth >= MAX_DEPTH:
            raise _Retry  # only the C path gets here: the pure-Python composer reports it at its line
        if isinstance(node, ScalarNode):
            value = self.scalar(node)
            if not isinstance(value, _JSON_SCALARS) and not (isinstance(value, float) and math.isfinite(value)):
                doc.not_json.append((where, value))
            if not isinstance(value, str) and node.value != canonical(value):
                doc.written[where] = node.value
            return value
        if type(node) in _PLAIN_TAGS and node.tag != _PLAIN_TAGS[type(node)]:
            # safe_load would refuse `!!python/...` on a list or mapping (or build a set/omap); never ignore a tag.
            raise YamlError(
                Issue(doc.path, node.start_mark.line + 1, f"invalid YAML: the tag {node.tag!r} is not allowed")
            )
        if isinstance(node, SequenceNode):
            return [self.convert(item, (*where, i), depth + 1) for i, item in enumerate(node.value)]
        if isinstance(node, MappingNode):
            out: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                line = key_node.start_mark.line + 1
                if key_node.tag == _MERGE:
                    raise YamlError(Issue(doc.path, line, "YAML merge keys (<<) are not allowed"))
                if not isinstance(key_node, ScalarNode):
                    raise YamlError(
                        Issue(
                            doc.path,
                            line,
                            "a key must be a plain name, not a mapping or list "
                            "(a value that starts with `{` or `[` must be quoted)",
                        )
                    )
                key = self.scalar(key_node)
                if not isinstance(key, str):
                    # `1: x` or `true: x` would be silently retyped by YAML; keys must be names.
                    key = str(key_node.value)
                if len(key) <= SHARE_MAX_CHARS:
                    key = sys.intern(key)
                if key in out:
                    first = doc.lines.get((*where, key), 0)
                    raise YamlError(
                        Issue(
                            doc.path,
                            line,
                            f"duplicate key {key!r} (first defined on line {first}); YAML would silently keep only the "
                            "last one: delete one of them",
                            key_node.start_mark.column + 1,
                        )
                    )
                path = _shared_path((*where, key))
                doc.lines[path] = line
                out[key] = self.convert(value_node, path, depth + 1)
            return out
        raise YamlError(Issue(doc.path, node.start_mark.line + 1, f"unsupported YAML node {node.tag}"))

    def scalar(self, node: ScalarNode) -> Any:
        tag = node.tag
        if tag == _STR:
            value: str = node.value
            # A lone surrogate (a `"\udcff"` escape): PyYAML builds it, libyaml never does, and no UTF-8
            # file, git message or page can carry it. Refused at its line, like any invalid text.
            if self.seen is None and SURROGATE.search(value) is not None:
                raise YamlError(
                    Issue(
                        self.doc.path,
                        node.start_mark.line + 1,
                        "invalid YAML: a \\u escape of a surrogate (U+D800 to U+DFFF) is not a character",
                    )
                )
            return sys.intern(value) if len(value) <= SHARE_MAX_CHARS else value
        constructor = _SCALARS.get(tag)
        try:
            if constructor is not None:
                return constructor(self.loader, node)
            return self.loader.construct_object(node, deep=True)  # other tags: refused as safe_load refuses them
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError) as exc:
            # `!!int abc`, `!!timestamp 2026-13-45`, an integer of 5,000 digits: PyYAML's
            # constructors raise plain Python errors for these.
            short = tag.rsplit(":", 1)[-1]
            shown = node.value if len(node.value) <= 40 else node.value[:37] + "..."
            raise YamlError(
                Issue(self.doc.path, node.start_mark.line + 1, f"invalid YAML: {shown!r} is not a valid {short}")
            ) from exc


def canonical(value: Any) -> str | None:
    """How argus shows a parsed non-string scalar (``true``, ``null``, ``1.1``), or None when it
    has no plain form (a date, binary data): text that differs is recorded in ``Document.written``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float) and math.isfinite(value):
        return repr(value)
    return None


def _shared_path(path: JsonPath) -> JsonPath:
    """``path``, or the equal tuple already held for another document (see :data:`_PATHS`)."""
    held = _PATHS.get(path)
    if held is not None:
        return held
    if len(_PATHS) < _PATHS_MAX and all(isinstance(p, int) or len(p) <= SHARE_MAX_CHARS for p in path):
        _PATHS[path] = path
    return path
