"""Validate documents against the JSON Schemas in ``schemas/`` (the one source of truth). Pure.

Schema files are read once, at first use, from the package data (``reconciler.schemas``,
mapped to the repository's ``schemas/`` folder by pyproject.toml).
"""

from __future__ import annotations

import datetime
import difflib
import json
import math
import re
from collections.abc import Iterator, Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from reconciler.errors import Issue
from reconciler.spec.yamldoc import Document

SCHEMA_FILES = {"Model": "model.schema.json", "Task": "task.schema.json", "Cluster": "cluster.schema.json"}


def schema_text(kind: str) -> str:
    """Return the schema file's text for ``kind`` (Model, Task, Cluster)."""
    name = SCHEMA_FILES[kind]
    try:
        return resources.files("reconciler.schemas").joinpath(name).read_text()
    except (ModuleNotFoundError, FileNotFoundError):
        # Running from a source checkout without an install: the folder sits beside the package.
        return (Path(__file__).resolve().parents[2] / "schemas" / name).read_text()


@cache
def schema(kind: str) -> dict[str, Any]:
    return json.loads(schema_text(kind))  # type: ignore[no-any-return]


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[ValidationError]:
    """``pattern`` as JSON Schema means it (ECMA-262): ``$`` is the end of the text. Python's
    ``$`` also matches before a final newline, so ``"HOME\\n"`` would pass ``^[A-Z_]+$``."""
    if not isinstance(instance, str):
        return
    found = _compiled(pattern).search(instance)
    if found is None or (pattern.endswith("$") and not pattern.endswith("\\$") and found.end() != len(instance)):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


_Validator = validators.extend(Draft202012Validator, {"pattern": _pattern})  # type: ignore[no-untyped-call]


@cache
def _validator(kind: str) -> Any:
    return _Validator(schema(kind))


def validate(doc: Document, kind: str) -> list[Issue]:
    """Return every schema violation of ``doc`` as a located Issue (empty when valid).

    Besides the schema: every value must be one JSON can carry (no dates, binary, NaN or
    infinity), since specs are hashed, sent to Ray and written to the status branch as JSON.
    The schema refuses most where it types a field; what it cannot see (NaN is a number to it)
    is reported here, once per line.
    """
    issues: list[Issue] = []
    for error in sorted(_validator(kind).iter_errors(doc.data), key=lambda e: list(map(str, e.absolute_path))):
        issues.extend(_to_issues(doc, error))
    if doc.not_json:
        reported = {i.line for i in issues}
        for where, value in doc.not_json:
            line = doc.line(where)
            if line not in reported:
                reported.add(line)
                issues.append(Issue(doc.path, line, f"{_field(where)}: {_not_json(value)}"))
    return sorted(set(issues))


def invalid_paths(doc: Document, kind: str) -> set[tuple[str | int, ...]]:
    """Return the field paths (at most two deep: ``("engine_kwargs", "x")``, ``("overrides", 3)``)
    that hold a schema violation or a value JSON cannot carry: the fields the loader's further
    checks skip, so one bad field never hides another field's problems. A missing required key
    holds no value and is not listed."""
    bad: set[tuple[str | int, ...]] = set()
    for error in _validator(kind).iter_errors(doc.data):
        where = tuple(error.absolute_path)
        if error.validator == "additionalProperties" and isinstance(error.instance, dict):
            allowed = error.schema.get("properties", {}) if isinstance(error.schema, Mapping) else {}
            bad.update((*where, k) for k in error.instance if k not in allowed)
        elif "propertyNames" in error.schema_path and isinstance(error.instance, str):
            bad.add((*where, error.instance))
        elif error.schema is False:
            bad.update((k,) for k, v in doc.data.items() if v is error.instance)
        elif error.validator != "required" and where:
            bad.add(where)
    bad.update(where for where, _ in doc.not_json if where)
    return {where[:2] for where in bad}


JSON_TYPES = ["string", "number", "boolean", "null", "array", "object"]


def _not_json(value: Any, written: str | None = None) -> str:
    """Why ``value`` (``written`` so in the file, when known) cannot be a JSON value, with what to
    write instead."""
    expected = "expected a JSON value (a string, number, true/false, null, list or mapping)"
    if isinstance(value, float):
        return f"{written or _show(value)} is not a JSON number (JSON has no NaN or infinity)"
    if isinstance(value, (datetime.date, datetime.datetime)):
        return f"{expected}, got {_quote_it(value, written)}"
    if isinstance(value, bytes):
        return f"{expected}, got binary data (!!binary); pass text instead"
    return f"{expected}, got {_shown(value, written)}"


def _scalar(value: Any) -> bool:
    """True for what a plain YAML scalar reads as besides a string (a number, boolean, null, date)."""
    return value is None or isinstance(value, (bool, int, float, datetime.date))


def _reading(value: Any) -> str:
    """What YAML made of a plain scalar, in words: ``the boolean true``, ``a date``."""
    if value is None:
        return "null (no value)"
    if isinstance(value, bool):
        return f"the boolean {_show(value)}"
    if isinstance(value, (int, float)):
        return f"the number {_show(value)}"
    if isinstance(value, datetime.datetime):
        return "a date and time"
    if isinstance(value, datetime.date):
        return "a date"
    return "binary data" if isinstance(value, bytes) else "a value that is not text"


def _quote_it(value: Any, written: str | None) -> str:
    """``value`` as the file wrote it, what YAML reads it as, and how to make it a string.

    ``version: 1.10`` -> ``1.10, which YAML reads as the number 1.1; quote it: "1.10"``."""
    text = written if written is not None else _shown(value, None)
    if value is None:
        if written == "":
            return "an empty value; write one (a string), or remove the key"
        return f"{text}, which YAML reads as null (no value); write a string, quoted if it is {text!r}"
    return f'{text}, which YAML reads as {_reading(value)}; quote it: "{text}"'


def described(doc: Document, where: tuple[str | int, ...]) -> str:
    """The value at ``where`` in ``doc`` for a message, as :func:`_shown` shows it (``'Task'``,
    ``yes (read as true)``, ``2026-01-02 (a date)``); ``doc`` must hold it."""
    value: Any = doc.data
    for part in where:
        value = value[part]
    return _shown(value, doc.written.get(tuple(where)))


def _shown(value: Any, written: str | None) -> str:
    """``value`` for a message: as the file wrote it when YAML read it as something else (``yes``
    read as true shows ``yes (read as true)``), never as Python writes it (``datetime.date(...)``)."""
    if isinstance(value, bytes):
        return "binary data (!!binary); pass text instead"
    if isinstance(value, datetime.date):
        return f"{written} ({_reading(value)})" if written else _reading(value)
    if written is not None and not isinstance(value, str):
        return f"{written} (read as {_show(value)})" if written else "an empty value"
    return _show(value)


def _field(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
        if isinstance(part, str) and not part.isprintable():
            part = repr(part)[1:-1]  # a key with a newline or control character stays on one line
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _to_issues(doc: Document, error: ValidationError) -> list[Issue]:
    where = tuple(error.absolute_path)
    name = _field(where)
    prefix = f"{name}: " if name else ""
    validator = error.validator
    # The failing subschema: a mapping, or False for a `false` schema (never Unset here).
    sub: Mapping[str, Any] = error.schema if isinstance(error.schema, Mapping) else {}
    if validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = sorted(sub.get("properties", {}))
        extras = [k for k in error.instance if k not in allowed]
        out = []
        for key in extras:
            hint = difflib.get_close_matches(str(key), allowed, n=1)
            suggestion = f" (did you mean {hint[0]!r}?)" if hint else f" (allowed: {', '.join(allowed)})"
            out.append(Issue(doc.path, doc.line((*where, key)), f"{_field((*where, key))}: unknown key{suggestion}"))
        return out
    if validator in ("maxLength", "maxItems", "maxProperties"):
        # Never quote the value: it is what is too long (and may be a secret).
        unit = {"maxLength": "characters", "maxItems": "items", "maxProperties": "keys"}[str(validator)]
        size = len(error.instance) if isinstance(error.instance, (str, list, dict)) else "?"
        limit = error.validator_value
        if "propertyNames" in error.schema_path and isinstance(error.instance, str):
            key = error.instance
            message = f"{_field((*where, key[:32] + '…'))}: the name is {size} {unit}; the limit is {limit}"
            return [Issue(doc.path, doc.line((*where, key)), message)]
        return [Issue(doc.path, doc.line(where), f"{prefix}{size} {unit}; the limit is {limit}")]
    if "propertyNames" in error.schema_path and isinstance(error.instance, str):
        # A bad key (env name, forbidden engine argument): report it on the key's own line.
        key = error.instance
        forbidden = sub.get("not", {}).get("enum")
        if forbidden and key in forbidden:
            msg = f"{_field((*where, key))}: is derived by argus and cannot be set here"
        else:
            pattern = sub.get("pattern")
            msg = f"{_field((*where, key))}: invalid name {key!r}" + (f" (must match {pattern})" if pattern else "")
        return [Issue(doc.path, doc.line((*where, key)), msg)]
    if error.schema is False:
        # jsonschema drops the property name for `false` subschemas; find it by identity.
        workload = doc.data.get("workload")
        mode = workload if isinstance(workload, str) else _shown(workload, doc.written.get(("workload",)))
        keys = [k for k, v in doc.data.items() if v is error.instance] or [name]
        return [Issue(doc.path, doc.line((*where, k)), f"{k}: not allowed with workload: {mode}") for k in keys]
    if validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return [Issue(doc.path, doc.line(where), f"{prefix}missing required key {missing!r}")]
    written = doc.written.get(where)
    if validator == "type" and error.validator_value == JSON_TYPES:
        return [Issue(doc.path, doc.line(where), f"{prefix}{_not_json(error.instance, written)}")]
    if validator == "type":
        expected = error.validator_value
        wants_text = expected == "string" or (isinstance(expected, list) and "string" in expected)
        if wants_text and _scalar(error.instance):
            message = f"expected {_types(expected)}, got {_quote_it(error.instance, written)}"
        else:
            message = f"expected {_types(expected)}, got {_shown(error.instance, written)}"
        return [Issue(doc.path, doc.line(where), prefix + message)]
    if validator == "enum":
        options = ", ".join(str(v) for v in error.validator_value)  # type: ignore[union-attr]
        return [Issue(doc.path, doc.line(where), f"{prefix}{_shown(error.instance, written)} is not one of: {options}")]
    if validator == "const":
        got = _shown(error.instance, written)
        return [Issue(doc.path, doc.line(where), f"{prefix}must be {error.validator_value!r}, got {got}")]
    if not isinstance(error.instance, (str, int, float, bool, type(None), list, dict)):
        # jsonschema's own text would show the value as Python writes it (datetime.date(...)).
        return [Issue(doc.path, doc.line(where), f"{prefix}{_not_json(error.instance, written)}")]
    if validator == "pattern" and where and where[0] == "overrides":
        return [
            Issue(doc.path, doc.line(where), f"{prefix}{_show(error.instance)} is not a hydra override `a.b.c=value`")
        ]
    return [Issue(doc.path, doc.line(where), f"{prefix}{error.message}")]


def _types(expected: Any) -> str:
    names = {
        "integer": "an integer",
        "string": "a string",
        "object": "a mapping",
        "array": "a list",
        "boolean": "true or false",
        "number": "a number",
        "null": "nothing",
    }
    if isinstance(expected, list):
        return " or ".join(names.get(e, str(e)) for e in expected)
    return names.get(expected, str(expected))


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (dict, list)):
        return "a mapping" if isinstance(value, dict) else "a list"
    if isinstance(value, float) and not math.isfinite(value):
        return ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
