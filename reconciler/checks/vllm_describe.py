"""Print vLLM's engine arguments as JSON: ``{"version": ..., "fields": {name: type}}``.

Run as a script in a child process (``python vllm_describe.py``) by
:mod:`reconciler.checks.engine_args`: importing vLLM takes seconds and pulls in torch (hundreds
of MB), which the daemon and ``argus validate`` must not carry. Imports nothing of argus.

A type is ``"int" | "float" | "bool" | "str" | "null" | "any"`` or ``{"literal": [...]}``,
``{"list": T}``, ``{"dict": T}`` (values), ``{"union": [T, ...]}``. What JSON cannot express (a
callable, a class, a config object) is ``"any"``: the check must never refuse what vLLM accepts.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import sys
import types
import typing
from typing import Any


def describe(tp: Any) -> Any:
    """The JSON description of the Python type ``tp``."""
    if tp is type(None) or tp is None:
        return "null"
    for python, name in ((bool, "bool"), (int, "int"), (float, "float"), (str, "str")):
        if tp is python:
            return name
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return {"literal": [a.value if isinstance(a, enum.Enum) else a for a in args if _jsonable(a)]}
    if origin in (typing.Union, types.UnionType):
        return {"union": [describe(a) for a in args]}
    if tp in (list, set, tuple, frozenset) or origin in (list, set, tuple, frozenset):
        items = [a for a in args if a is not Ellipsis]
        return {"list": describe(items[0]) if len(set(map(str, items))) == 1 else "any"}
    if tp is dict or origin is dict:
        return {"dict": describe(args[1]) if len(args) == 2 else "any"}
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = [m.name for m in tp] + [m.value for m in tp if isinstance(m.value, (str, int))]
        return {"literal": list(dict.fromkeys(values))}
    return "any"


def _jsonable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool, enum.Enum)) or value is None


def main() -> int:
    """Print the table on stdout. Returns 0; raises ImportError when vLLM cannot be imported.

    vLLM's logger writes to stdout (``VLLM_LOGGING_STREAM``'s default; the GPU build says on a machine
    without a GPU that Triton is disabled): while vLLM is imported and read, stdout is stderr, so only
    the JSON reaches stdout."""
    out = sys.stdout
    sys.stdout = sys.stderr
    try:
        table = _table()
    finally:
        sys.stdout = out
    json.dump(table, out)
    return 0


def _table() -> dict[str, Any]:
    """``{"version": ..., "fields": ...}`` of the vLLM this interpreter imports."""
    import vllm
    from vllm.engine.arg_utils import AsyncEngineArgs

    classes: list[Any] = [AsyncEngineArgs]
    try:  # Ray Serve LLM also takes the OpenAI frontend's arguments in engine_kwargs
        from vllm.entrypoints.launchers.cli_args import FrontendArgs

        classes.append(FrontendArgs)
    except ImportError:
        pass
    fields: dict[str, Any] = {}
    for cls in classes:
        for f in dataclasses.fields(cls):
            if not f.name.startswith("_"):
                fields[f.name] = describe(f.type)
    return {"version": vllm.__version__, "fields": fields}


if __name__ == "__main__":
    sys.exit(main())
