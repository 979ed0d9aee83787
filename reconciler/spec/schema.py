"""Validate documents against the JSON Schemas in ``schemas/`` (the one source of truth). Pure.

Schema files are read once, at first use, from the package data (``reconciler.schemas``,
mapped to the repository's ``schemas/`` folder by pyproject.toml).
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator
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


@cache
def _validator(kind: str) -> Draft202012Validator:
    return Draft202012Validator(schema(kind))


def validate(doc: Document, kind: str) -> list[Issue]:
    """Return every schema violation of ``doc`` as a located Issue (empty when valid)."""
    issues: list[Issue] = []
    for error in sorted(_validator(kind).iter_errors(doc.data), key=lambda e: list(map(str, e.absolute_path))):
        issues.extend(_to_issues(doc, error))
    return sorted(set(issues))


def _field(path: tuple[str | int, ...]) -> str:
    out = ""
    for part in path:
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
        keys = [k for k, v in doc.data.items() if v is error.instance] or [name]
        return [Issue(doc.path, doc.line((*where, k)), f"{k}: not allowed with workload: {workload}") for k in keys]
    if validator == "required":
        missing = error.message.split("'")[1] if "'" in error.message else error.message
        return [Issue(doc.path, doc.line(where), f"{prefix}missing required key {missing!r}")]
    if validator == "type":
        expected = error.validator_value
        return [Issue(doc.path, doc.line(where), f"{prefix}expected {_types(expected)}, got {_show(error.instance)}")]
    if validator == "enum":
        options = ", ".join(str(v) for v in error.validator_value)  # type: ignore[union-attr]
        return [Issue(doc.path, doc.line(where), f"{prefix}{_show(error.instance)} is not one of: {options}")]
    if validator == "const":
        return [
            Issue(doc.path, doc.line(where), f"{prefix}must be {error.validator_value!r}, got {_show(error.instance)}")
        ]
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
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
