"""Check a verl task's hydra overrides against verl's real config. I/O (reads verl's YAML).

hydra is optional (the ``[check]`` extra brings it): without it :func:`check_overrides` returns
``[]`` and :func:`verl_available` says so, so the base install never needs it. The config tree is
the installed verl's (what the cluster runs) or, without verl, the copy of the pinned verl's that
ships with argus (:mod:`reconciler.checks.snapshots`). Only the YAML is read: ``verl`` is never
imported (it would pull in torch and ray).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import re
from functools import lru_cache
from typing import Any

from reconciler.builders.jobs import derived_overrides, run_dir, verl_config_name
from reconciler.checks.snapshots import verl_snapshot_dir
from reconciler.spec.types import ClusterSpec, TaskSpec

_OVERRIDE_KEY = re.compile(r"Could not (?:override|append to config\.) '([^']+)'")
_DELETE_KEY = re.compile(r"Could not delete from config\. '([^']+)'")
_GROUP_KEY = re.compile(r"Could not find '([^']+)'")


def installed_verl_config_dir() -> str | None:
    """Return the installed verl's ``trainer/config`` folder, or None when verl is not installed."""
    try:
        spec = importlib.util.find_spec("verl")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for base in spec.submodule_search_locations:
        folder = os.path.join(base, "trainer", "config")
        if os.path.isdir(folder):
            return folder
    return None


def verl_config_dir() -> str | None:
    """The config tree overrides are composed against: the installed verl's, else the shipped copy."""
    return installed_verl_config_dir() or verl_snapshot_dir()


def verl_source() -> str:
    """Which config tree :func:`verl_config_dir` uses, for notes: ``installed verl`` or the snapshot."""
    if installed_verl_config_dir():
        return "the installed verl"
    version = os.path.join(verl_snapshot_dir() or "", "VERSION")
    try:
        with open(version, encoding="utf-8") as fh:
            return f"verl {fh.read().strip()} (the copy shipped with argus)"
    except OSError:
        return "the verl copy shipped with argus"


def verl_available() -> bool:
    """True when a verl config tree and hydra are both there (overrides can be checked)."""
    try:
        hydra = importlib.util.find_spec("hydra") is not None
    except (ImportError, ValueError):
        hydra = False
    return hydra and verl_config_dir() is not None


def check_overrides(task: TaskSpec, cluster: ClusterSpec) -> list[tuple[int, str]]:
    """Compose verl's config with every override the job would pass.

    Returns ``(line, message)`` per rejected override: the line of the user's override in
    the task file (``task.override_lines``), or 0 for an argus-generated override (a verl
    version drift). Returns ``[]`` for command tasks, when all overrides compose, or when
    verl/hydra are not installed. Does not raise for bad overrides.
    """
    if task.workload == "command" or not verl_available():
        return []
    derived = _safe_derived(task, cluster)
    user = list(task.overrides)
    lines = list(task.override_lines) + [0] * (len(user) - len(task.override_lines))
    entries = [(0, ov) for ov in derived] + list(zip(lines, user, strict=True))
    return list(_check(verl_config_name(task), tuple(entries)))


# A compose costs ~0.3 s and the daemon re-loads every tick: an unchanged task (same
# overrides, same lines) is checked once.
@lru_cache(maxsize=4096)
def _check(config: str, entries: tuple[tuple[int, str], ...]) -> tuple[tuple[int, str], ...]:
    issues: list[tuple[int, str]] = []
    # Syntax first: each override parses on its own, which pins a parse error to its line.
    parsable = []
    for line, ov in entries:
        syntax = _parse_error(ov)
        if syntax is None:
            parsable.append((line, ov))
        else:
            issues.append((line, f"override `{ov}` is not valid hydra syntax: {syntax}"))
    # Then composition; hydra stops at the first bad override, so drop it and go again.
    remaining = parsable
    rejected: set[tuple[int, str]] = set()
    while remaining:
        error = _compose_error(config, tuple(ov for _, ov in remaining))
        if error is None:
            break
        index = _culprit(config, remaining, error)
        line, ov = remaining.pop(index)
        rejected.add((line, ov))
        issues.append((line, _message(config, ov, error, generated=line == 0)))
    # Last the value types: verl's YAML tree is untyped, so hydra composes `two-hundred` into an
    # integer setting and the run fails minutes later, on the cluster. argus's own overrides
    # (line 0) are typed by construction.
    for line, ov in parsable:
        if line and (line, ov) not in rejected:
            problem = _type_error(config, ov)
            if problem:
                issues.append((line, problem))
    return tuple(sorted(issues))


# What a value of each default's type must be, in words.
_EXPECTS = {bool: "true or false", int: "an integer", float: "a number"}


def _type_error(config_name: str, override: str) -> str | None:
    """Why ``override``'s value cannot be of the type of verl's default for its key, or None.

    Conservative: only a key whose default is a plain int, float or bool is judged, and only a
    value that is clearly not one: ``null``, interpolations (``${oc.env:X}``), lists, mappings and
    sweeps pass, and so does text that reads as the type (``'256'``). A float passes where the
    default is an int (verl writes float settings such as ``top_p: 1`` and ``temperature: 0``
    with integer defaults), and 0 or 1 where it is a bool (Python reads them as false and true).
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides([override])[0]
    except HydraException:
        return None  # reported as a syntax error
    key = parsed.key_or_group
    if parsed.is_delete() or parsed.is_sweep_override() or "/" in key or "@" in key:
        return None
    default = _default_of(config_name, key)
    if default is None:
        return None
    value = parsed.value()
    if value is None or isinstance(value, (list, dict)) or (isinstance(value, str) and "${" in value):
        return None
    kind = type(default)
    if kind is bool:
        fits = isinstance(value, bool) or value in (0, 1) or str(value).strip().lower() in ("true", "false")
    elif isinstance(value, bool):
        fits = False
    else:
        fits = isinstance(value, (int, float)) or _reads_as_number(str(value), integer=kind is int)
    if fits:
        return None
    got = "an empty value" if value == "" else _shown_value(value)
    return (
        f"{key} expects {_EXPECTS[kind]} (verl default {_shown_value(default)}), got {got}; "
        f"write e.g. `{key}={_shown_value(default)}`"
    )


def _reads_as_number(text: str, *, integer: bool) -> bool:
    """True when ``text`` (a quoted or unusual value hydra kept as a string) reads as a number."""
    text = text.strip()
    try:
        int(text, 0)
        return True
    except ValueError:
        pass
    if integer:
        return False
    try:
        float(text)
    except ValueError:
        return False
    return True


def _shown_value(value: object) -> str:
    """A value as an override writes it: ``true``, ``256``, ``'two-hundred'``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def _default_of(config_name: str, key: str) -> bool | int | float | None:
    """verl's default for ``key`` when it is a plain int, float or bool (not an interpolation); else None."""
    from omegaconf import DictConfig, OmegaConf

    try:
        node: Any = _base_config(config_name)
    except Exception:  # the type check is an addition; never fail the check for it
        return None
    parts = key.split(".")
    for part in parts[:-1]:
        child = node._get_node(part) if isinstance(node, DictConfig) and part in node else None
        if not isinstance(child, DictConfig):
            return None
        node = child
    last = parts[-1]
    if not isinstance(node, DictConfig) or last not in node or OmegaConf.is_interpolation(node, last):
        return None
    leaf = node._get_node(last)
    value = leaf._value() if leaf is not None else None
    return value if isinstance(value, (bool, int, float)) else None


def _safe_derived(task: TaskSpec, cluster: ClusterSpec) -> list[str]:
    """argus's overrides; placeholder paths when model/data are not resolved (offline checks)."""
    from dataclasses import replace

    if not task.model_path or not task.data_train:
        task = replace(task, model_path=task.model_path or "/unresolved", data_train=task.data_train or "/unresolved")
    return derived_overrides(task, cluster, run_folder=run_dir(task, cluster), wandb=False)


def _parse_error(override: str) -> str | None:
    """Return hydra's parse error for one override, or None when it parses."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        OverridesParser.create().parse_overrides([override])
    except HydraException as exc:
        return str(exc).splitlines()[0]
    return None


def _compose_error(config_name: str, overrides: tuple[str, ...]) -> Exception | None:
    """Compose ``config_name`` with ``overrides``; return the error or None."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        _compose(config_name, overrides)
    except (HydraException, OmegaConfBaseException, ValueError, KeyError) as exc:
        return exc
    return None


def _compose(config_name: str, overrides: tuple[str, ...]) -> Any:
    """Return verl's composed (unresolved) config. Raises hydra's errors."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    folder = verl_config_dir()
    assert folder is not None
    # hydra keeps one global instance; a leftover one (e.g. a crashed compose) would
    # make initialize_config_dir refuse to start.
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=folder, version_base=None):
        return compose(config_name=config_name, overrides=list(overrides))


@lru_cache(maxsize=4)
def _base_config(config_name: str) -> Any:
    """verl's config without overrides, for "did you mean" suggestions."""
    return _compose(config_name, ())


def _key_of(override: str) -> str:
    """``+a.b=1`` -> ``a.b``; ``~a.b`` -> ``a.b``."""
    return override.split("=", 1)[0].lstrip("+~")


def _culprit(config_name: str, entries: list[tuple[int, str]], error: Exception) -> int:
    """Index in ``entries`` of the override hydra rejected.

    Uses the key hydra names in its message (the last override of that key, as hydra
    applies them in order); otherwise finds the shortest failing prefix (one compose each).
    """
    text = str(error)
    for pattern in (_OVERRIDE_KEY, _DELETE_KEY, _GROUP_KEY):
        match = pattern.search(text)
        if match:
            key = match.group(1)
            for i in range(len(entries) - 1, -1, -1):
                if _key_of(entries[i][1]) == key:
                    return i
    for i in range(len(entries)):
        if _compose_error(config_name, tuple(ov for _, ov in entries[: i + 1])) is not None:
            return i
    return len(entries) - 1


def _message(config_name: str, override: str, error: Exception, *, generated: bool) -> str:
    """A one-paragraph explanation of why ``override`` was rejected."""
    key = _key_of(override)
    cause = str(error.__cause__ or error).splitlines()[0]
    if "not in struct" in cause or "Could not override" in str(error):
        msg = f"unknown key `{key}` in verl's {config_name} config (override `{override}`)"
        hint = _suggest(config_name, key)
        if hint:
            msg += f"; did you mean `{hint}`?"
        msg += f" To add a new key write `+{override.lstrip('+')}`."
    else:
        msg = f"override `{override}` rejected by verl's {config_name} config: {cause}"
    if generated:
        msg += " (generated by argus: the installed verl version differs from the one argus targets)"
    return msg


def _suggest(config_name: str, key: str) -> str | None:
    """The closest existing key to ``key`` (same parent), or None."""
    from omegaconf import DictConfig

    try:
        node = _base_config(config_name)
    except Exception:  # a suggestion is optional; never fail the check for it
        return None
    parts = key.split(".")
    for i, part in enumerate(parts[:-1]):
        child = node.get(part) if isinstance(node, DictConfig) else None
        if not isinstance(child, DictConfig):
            # The first unknown part is what is misspelt.
            return _closest(node, parts[:i], part)
        node = child
    return _closest(node, parts[:-1], parts[-1])


def _closest(node: Any, prefix: list[str], part: str) -> str | None:
    from omegaconf import DictConfig

    if not isinstance(node, DictConfig):
        return None
    match = difflib.get_close_matches(part, [str(k) for k in node], n=1)
    return ".".join([*prefix, match[0]]) if match else None
