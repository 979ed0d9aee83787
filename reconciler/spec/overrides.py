"""What a user may set through verl ``overrides`` and vLLM ``engine_kwargs`` (security-relevant). Pure.

Admission counts ``nodes x gpus_per_node`` (tasks) and ``replicas x gpus_per_replica`` (models),
and the path policy confines ``source``/``data``/``working_dir`` to the user's home and the shared
cache. Both would be empty promises if the free-form fields could say otherwise, so:

- keys argus derives or admission counts (GPUs, nodes, Ray placement, checkpoint and log folders,
  model and data paths, run names) are refused, naming the field to use instead;
- every value that is a path (a known path key, or anything that looks like an absolute path,
  ``$HOME/...`` or ``~...``) goes through :func:`reconciler.spec.paths.resolve_path`; ``$HOME`` is
  expanded in the value that reaches verl/vLLM (neither expands it);
- ``trust_remote_code`` (and a parser plugin file) run code from a folder inside the serving or
  training process: refused unless ``serving.allow_trust_remote_code`` is set in cluster.yaml; so
  are engine arguments that name code (a class, module, plugin, logging config, compile cache) and
  model ``env`` variables that make the replica load code or config-as-code from a location.

Keys are compared case-insensitively and without hydra's ``+``/``++``/``~`` prefixes: a key that
only differs by case cannot set the real key, but refusing it costs nothing and closes the question.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from reconciler.spec.paths import FileSystem, PathError, is_hf_id, resolve_path, resolve_source
from reconciler.spec.types import Paths

# (field path relative to the checked mapping, message)
Finding = tuple[tuple[str | int, ...], str]

_RUN_FOLDER = "argus writes checkpoints and logs into the run folder it derives ($ARGUS_RUN_DIR)"
_GPUS = "argus counts GPUs from `nodes` x `gpus_per_node` (admission and quota)"

# Exact keys argus sets in every verl job (reconciler.builders.jobs.derived_overrides), or that name
# what they derive from: key -> what to write instead.
DERIVED_KEYS: dict[str, str] = {
    "trainer.nnodes": "set `nodes` instead",
    "trainer.n_gpus_per_node": "set `gpus_per_node` instead",
    "trainer.total_epochs": "set `epochs` instead",
    "trainer.total_training_steps": "set `steps` instead",
    "trainer.project_name": "argus names the run after its user",
    "trainer.experiment_name": "argus names the run after its task",
    "trainer.default_local_dir": f"{_RUN_FOLDER}; serve a checkpoint with `source: task:<name>`",
    "trainer.default_hdfs_dir": _RUN_FOLDER,
    "trainer.rollout_data_dir": _RUN_FOLDER,
    "trainer.validation_data_dir": _RUN_FOLDER,
    "actor_rollout_ref.model.path": "set `model` instead",
    "critic.model.path": "set `model` instead",
    "model.path": "set `model` instead",
    "data.train_files": "set `data.train` instead",
    "data.val_files": "set `data.val` instead",
}

# Patterns over the normalised key (any depth): resources and placement.
PROTECTED: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"(^|\.)nnodes$"), f"{_GPUS}; set `nodes` instead"),
    (re.compile(r"(^|\.)n_gpus_per_node$"), f"{_GPUS}; set `gpus_per_node` instead"),
    (re.compile(r"resource_pool"), f"{_GPUS}; a separate resource pool would take GPUs the plan never counted"),
    (re.compile(r"(^|\.)(ray_kwargs|ray_init)(\.|$)"), "Ray's settings (resources, runtime env) are the cluster's"),
    (re.compile(r"(^|\.)(num_gpus|num_cpus|resources|placement_group\w*)$"), _GPUS),
    (re.compile(r"(^|\.)checkpoint\.[^.]*dir[^.]*$"), _RUN_FOLDER),
    (re.compile(r"^hydra(\.|$)"), "hydra's own settings (search path, run folder) are argus's"),
)

# The checkpoint cadence (cluster.yaml's training.checkpoint_every_steps): a task may only lower it; a
# larger value is capped where the job is built (reconciler.builders.jobs.kept_cadence), not refused here.
SAVE_FREQ_KEY = "trainer.save_freq"
# verl writes no checkpoint tracker after an asynchronous (Megatron) save, so a preempted run would
# resume from nothing: the cadence would bound nothing.
ASYNC_SAVE_SUFFIX = "checkpoint.async_save"
_ASYNC_SAVE = (
    "asynchronous checkpoint saves write no `latest_checkpointed_iteration.txt`, so a preempted run "
    "would resume from step 0; argus resumes runs from that file"
)

# A parallel size splits the task's GPUs; it may not ask for more than the task has.
_PARALLEL = re.compile(r"(^|\.)[a-z_]*_parallel_size$")

# Keys whose value is a path, at any depth (verl's config tree and vLLM's engine arguments).
PATH_KEYS = frozenset(
    {
        "path",
        "model",
        "tokenizer",
        "download_dir",
        "train_files",
        "val_files",
        "model_weights",
        "allowed_local_media_path",
        "spec_model",
        "generation_config",
        "reasoning_parser_plugin",
        "tool_parser_plugin",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_ca_certs",
    }
)
_PATH_SUFFIXES = ("_path", "_dir", "_file", "_files")
# Path keys that may also name a Hugging Face repo (resolved through the shared cache).
_HF_KEYS = re.compile(r"(^|[._])(model|tokenizer|hf_config)")
# vLLM keywords that are not paths although they sit in a path key.
_KEYWORDS = frozenset({"auto", "vllm", "none", "null", ""})

TRUST_KEYS = frozenset({"trust_remote_code"})
# A file of Python code loaded into the replica: the same trust as trust_remote_code.
CODE_FILE_KEYS = frozenset({"reasoning_parser_plugin", "tool_parser_plugin"})
# vLLM engine arguments (at any depth) that name code to import or a file that is code or
# config-as-code, from vLLM 0.32's EngineArgs and its sub-configs: a class or module by qualified
# name (worker_cls, scheduler_cls, kv_connector_module_path, model_class_overrides, ...), a plugin,
# a logging dictConfig file (its "()" key calls any function), and a compile cache folder (vLLM
# and torch load pickled artifacts from it). hf_overrides and model_impl stay open: they only pick
# among classes vLLM/transformers already ship; a model's own code still needs trust_remote_code.
CODE_ENGINE_KEYS = frozenset(
    {"logging_config", "log_config_file", "logits_processors", "logits_processor_pattern"}
    | {"model_class_overrides", "cache_dir", "local_cache_dir", "inductor_compile_config"}
)
_CODE_ENGINE_SUFFIX = re.compile(r"(_cls|_class|_module|_module_path|_plugin|_plugins)$|^plugins?$")
_ALLOW = "the admin must set `serving.allow_trust_remote_code: true` in cluster.yaml"
_TRUST = f"runs code from the model's folder inside the process, with the cluster's credentials; {_ALLOW}"

# vLLM engine arguments that size a replica (Ray Serve LLM places tensor x pipeline parallel GPUs).
ENGINE_GPU_KEYS: dict[str, str] = {
    "pipeline_parallel_size": "set `gpus_per_replica` instead",
    "prefill_context_parallel_size": "set `gpus_per_replica` instead",
    "data_parallel_size": "set `replicas` instead",
    "data_parallel_size_local": "set `replicas` instead",
    "data_parallel_rank": "set `replicas` instead",
    "data_parallel_start_rank": "set `replicas` instead",
    "data_parallel_address": "set `replicas` instead",
    "data_parallel_rpc_port": "set `replicas` instead",
    "data_parallel_backend": "set `replicas` instead",
    "nnodes": "set `gpus_per_replica` instead",
    "node_rank": "set `gpus_per_replica` instead",
    "master_addr": "Ray Serve places the replica",
    "master_port": "Ray Serve places the replica",
    "distributed_executor_backend": "Ray Serve places the replica",
    "device_ids": "Ray Serve places the replica",
}

# What starts a path: an absolute path, $HOME, `~`, another variable (refused), or a file:// URI.
_PATH_START = r"(?:file://)?(?:/|\$HOME\b|~[/A-Za-z_]|\$[A-Za-z_])"
_PATH_PREFIX = re.compile(_PATH_START)
# A path in unquoted hydra text: at the start or after a delimiter (so `http://x/y` and `a/b` are
# not paths), up to the next list/mapping delimiter. It runs through spaces: hydra keeps them.
_PATH_IN_TEXT = re.compile(r"(?:^|(?<=[\s\[,{(=])|(?<=:)(?!//))" + _PATH_START + r"[^,\]})'\"]*")
_QUOTED = re.compile(r"'((?:[^'\\]|\\.)*)'|\"((?:[^\"\\]|\\.)*)\"")
# `..` in a relative path climbs from wherever the job or replica runs, out of any root.
_DOTDOT_TEXT = re.compile(r"(?:^|[/\\\s,\[{(=:'\"])\.\.(?:[/\\]|$|[\s,\]})'\"])")
_DOTDOT_WHOLE = re.compile(r"(?:^|[/\\])\.\.(?:[/\\]|$)")
_DOTDOT_WHY = "`..` is not allowed in a path (it could climb out of your home from wherever the job runs)"
_RESOLVER = re.compile(r"\$\{\s*([A-Za-z_][\w.]*)\s*:([^}]*)\}")
# Interpolations argus itself sets in every job's environment (reconciler.builders.jobs.job_env).
_ARGUS_ENV = frozenset({"ARGUS_RUN_DIR", "ARGUS_CHECKPOINT_DIR"})
_FALSE = frozenset({"false", "0", "null", "none", "no", "off", "~", ""})


def field_name(where: Sequence[str | int]) -> str:
    """``("overrides", 2)`` -> ``overrides[2]``; ``("engine_kwargs", "a", "b")`` -> ``engine_kwargs.a.b``."""
    out = ""
    for part in where:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def normalise_key(raw: str) -> str:
    """``++Trainer . NNodes`` -> ``trainer.nnodes`` (hydra prefixes, case and whitespace removed)."""
    key = raw.strip().lstrip("+~").strip()
    return ".".join(part.strip() for part in key.lower().split(".") if part.strip())


def split_override(text: str) -> tuple[str, str, str | None]:
    """Return ``(prefix, key, value)`` of a hydra override; ``value`` is None for a deletion without one."""
    stripped = text.strip()
    prefix = stripped[: len(stripped) - len(stripped.lstrip("+~"))]
    if "=" not in stripped:
        return prefix, stripped[len(prefix) :].strip(), None
    key, value = stripped[len(prefix) :].split("=", 1)
    return prefix, key.strip(), value.strip()


def protected(key: str) -> str | None:
    """Why ``key`` (normalised) is argus's, or None when a user may set it."""
    if key in DERIVED_KEYS:
        return f"`{key}` is derived by argus; {DERIVED_KEYS[key]}"
    for pattern, why in PROTECTED:
        if pattern.search(key):
            return f"`{key}` is argus's: {why}"
    if any(d.startswith(key + ".") for d in DERIVED_KEYS):
        return f"`{key}` holds keys argus derives; set the keys below it one by one"
    return None


def check_overrides(
    overrides: Sequence[str],
    *,
    user: str,
    nodes: int,
    gpus_per_node: int,
    paths: Paths,
    fs: FileSystem | None,
    allow_trust_remote_code: bool = False,
) -> tuple[list[str], list[tuple[int, str]]]:
    """Check a verl task's hydra ``overrides``.

    Returns the overrides as they go to verl (``$HOME`` expanded in path values) and
    ``(index, message)`` per refused override. Never raises.
    """
    out: list[str] = []
    found: list[tuple[int, str]] = []
    for index, text in enumerate(overrides):
        prefix, raw_key, value = split_override(text)
        key = normalise_key(raw_key)
        problems, value_out = _check_entry(
            key, value, user=user, nodes=nodes, gpus_per_node=gpus_per_node, paths=paths, fs=fs,
            allow_trust=allow_trust_remote_code,
        )  # fmt: skip
        found.extend((index, p) for p in problems)
        out.append(text if value_out == value or value_out is None else f"{prefix}{raw_key}={value_out}")
    return out, found


def _check_entry(
    key: str,
    value: str | None,
    *,
    user: str,
    nodes: int,
    gpus_per_node: int,
    paths: Paths,
    fs: FileSystem | None,
    allow_trust: bool,
) -> tuple[list[str], str | None]:
    """Problems of one ``key=value`` (recursing into a hydra dict value) and the value to pass on."""
    why = protected(key)
    if why:
        return [why], value
    if key.endswith(ASYNC_SAVE_SUFFIX) and value is not None and _truthy(value):
        return [f"`{key}`: {_ASYNC_SAVE}"], value
    if value is None:
        return [], value
    last = key.rsplit(".", 1)[-1]
    if last in TRUST_KEYS | CODE_FILE_KEYS and not allow_trust and _truthy(value):
        return [f"`{key}` {_TRUST}"], value
    if _PARALLEL.search(key):
        return _parallel(key, value, nodes, gpus_per_node), value
    if value.startswith("{"):
        entries = _dict_entries(value)
        if entries is None:
            return [f"`{key}`: cannot read the mapping {value!r}; set its keys one by one"], value
        problems: list[str] = []
        for sub_key, sub_value in entries:
            sub, _ = _check_entry(
                f"{key}.{normalise_key(sub_key)}", sub_value, user=user, nodes=nodes, gpus_per_node=gpus_per_node,
                paths=paths, fs=fs, allow_trust=allow_trust,
            )  # fmt: skip
            problems.extend(sub)
        if problems:
            return problems, value
        # Paths inside the mapping are checked (and $HOME expanded) as anywhere else.
    interpolation = _interpolation_problem(key, value)
    if interpolation:
        return [interpolation], value
    return _path_value(key, last, value, user, paths, fs, hydra=True)


def _truthy(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().strip("'\"").lower() not in _FALSE
    return bool(value)


def _parallel(key: str, value: str, nodes: int, gpus_per_node: int) -> list[str]:
    limit = gpus_per_node if "tensor" in key.rsplit(".", 1)[-1] else nodes * gpus_per_node
    where = "`gpus_per_node`" if limit == gpus_per_node else "`nodes` x `gpus_per_node`"
    try:
        size = int(value.strip("'\""))
    except ValueError:
        return [f"`{key}`: {value!r} is not a number; a parallel size must be an integer from 1 to {limit}"]
    if not 1 <= size <= limit:
        return [f"`{key}={size}` asks for more GPUs than the task has ({where} = {limit}); {_GPUS}"]
    return []


def _interpolation_problem(key: str, value: str) -> str | None:
    """A resolver interpolation (``${oc.env:X}``) reads values argus never checked."""
    for match in _RESOLVER.finditer(value):
        resolver, arg = match.group(1), match.group(2).strip()
        if resolver == "oc.env" and arg.split(",")[0].strip() in _ARGUS_ENV:
            continue
        return (
            f"`{key}`: the interpolation `{match.group(0)}` reads a value argus cannot check; "
            f"only ${{oc.env:ARGUS_RUN_DIR}} and ${{oc.env:ARGUS_CHECKPOINT_DIR}} are allowed"
        )
    if "${" in value and re.search(r"(^|/)\.\.(/|$)", value):
        return f"`{key}`: `..` after an interpolation could leave the run folder"
    return None


def _path_value(
    key: str, last: str, value: str, user: str, paths: Paths, fs: FileSystem | None, *, hydra: bool
) -> tuple[list[str], str]:
    """Check every path in ``value`` (a known path key's whole value, and anything path-like).

    Returns the problems and the value with ``$HOME`` expanded.
    """
    problems: list[str] = []
    is_path_key = last in PATH_KEYS or last.endswith(_PATH_SUFFIXES)
    bare = value.strip().strip("'\"") if hydra else value
    hf_ok = is_path_key and bool(_HF_KEYS.search(last))
    if is_path_key and hf_ok and is_hf_id(bare):
        try:
            resolve_source(bare, user, paths, fs)
        except PathError as exc:
            problems.append(f"`{key}`: {exc}")
        return problems, value
    relative = (
        is_path_key
        and bare.lower() not in _KEYWORDS
        and not bare.startswith(("[", "{", "${"))
        and not _PATH_PREFIX.match(bare)
        and ("://" not in bare or bare.startswith("file://"))
    )
    if relative:
        return [f"`{key}`: {bare!r}: relative paths are not allowed; start with $HOME/ or /"], value

    def check(token: str) -> str:
        """The policy-checked path (``$HOME`` expanded), or ``token`` unchanged when refused."""
        raw = token[len("file://") :] if token.startswith("file://") else token
        try:
            resolved = resolve_path(raw, user, paths, fs, must_exist=False)
        except PathError as exc:
            problems.append(f"`{key}`: {exc}")
            return token
        return token.replace(raw, resolved, 1) if raw.startswith("$HOME") else token

    def in_text(text: str) -> str:
        return _PATH_IN_TEXT.sub(lambda m: check(m.group(0).rstrip()) + m.group(0)[len(m.group(0).rstrip()) :], text)

    if not hydra:
        # A YAML value is already split into lists and mappings: a string is a path when it
        # starts like one, as a whole (a chat template's `{{ a / b }}` is not).
        out_value = check(value) if _PATH_PREFIX.match(value) else value
        if not problems and _DOTDOT_WHOLE.search(value):
            problems.append(f"`{key}`: {value!r}: {_DOTDOT_WHY}")
        return problems, out_value
    # A hydra value is text. A quoted string is one value (commas and spaces included), so it is
    # checked whole: checking only its first part would let `'$HOME/x, ../../alice'` through.
    out, pos = [], 0
    for match in _QUOTED.finditer(value):
        out.append(in_text(value[pos : match.start()]))
        content = match.group(1) if match.group(1) is not None else match.group(2)
        quote = match.group(0)[0]
        out.append(quote + (check(content) if _PATH_PREFIX.match(content) else in_text(content)) + quote)
        pos = match.end()
    out.append(in_text(value[pos:]))
    if not problems and _DOTDOT_TEXT.search(value):
        problems.append(f"`{key}`: {value!r}: {_DOTDOT_WHY}")
    return problems, "".join(out)


def _dict_entries(text: str) -> list[tuple[str, str]] | None:
    """The top-level ``(key, value-text)`` pairs of a hydra mapping ``{a: 1, b: {c: 2}}``; None if unreadable."""
    body = text.strip()
    if not (body.startswith("{") and body.endswith("}")):
        return None
    body = body[1:-1]
    parts: list[str] = []
    depth, quote, start = 0, "", 0
    for i, ch in enumerate(body):
        if quote:
            if ch == quote and body[i - 1] != "\\":
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
            if depth < 0:
                return None
        elif ch == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    if quote or depth:
        return None
    parts.append(body[start:])
    out: list[tuple[str, str]] = []
    for part in parts:
        if not part.strip():
            continue
        if ":" not in part:
            return None
        key, value = part.split(":", 1)
        key = key.strip().strip("'\"")
        if not re.fullmatch(r"[A-Za-z0-9_\-. ]+", key):
            return None
        out.append((key, value.strip()))
    return out


def check_engine_kwargs(
    engine_kwargs: Mapping[str, Any],
    *,
    user: str,
    paths: Paths,
    fs: FileSystem | None,
    allow_trust_remote_code: bool = False,
) -> tuple[dict[str, Any], list[Finding]]:
    """Check a model's vLLM ``engine_kwargs``.

    Returns the engine arguments as they go to vLLM (``$HOME`` expanded in path values) and one
    ``(field path below engine_kwargs, message)`` per refusal. Never raises.
    """
    found: list[Finding] = []
    out: dict[str, Any] = {}
    for key, value in engine_kwargs.items():
        name = str(key)
        lowered = name.strip().lower()
        if lowered in ENGINE_GPU_KEYS:
            found.append(((name,), f"is argus's: Ray Serve sizes the replica from it; {ENGINE_GPU_KEYS[lowered]}"))
            out[name] = value
            continue
        out[name] = _engine_value((name,), value, user, paths, fs, allow_trust_remote_code, found)
    return out, found


def _engine_value(
    where: tuple[str | int, ...],
    value: Any,
    user: str,
    paths: Paths,
    fs: FileSystem | None,
    allow_trust: bool,
    found: list[Finding],
) -> Any:
    last = str(where[-1]).lower() if isinstance(where[-1], str) else ""
    if last in TRUST_KEYS | CODE_FILE_KEYS and not allow_trust and _truthy(value):
        found.append((where, _TRUST))
        return value
    if is_code_engine_key(last) and not allow_trust and _truthy(value) and value != "auto":
        found.append((where, f"names code or a file that vLLM loads as code, with the cluster's credentials; {_ALLOW}"))
        return value
    if last.endswith("_module_path"):
        # A dotted module name (kv_connector_module_path), not a file: trusted, it goes as written.
        return value
    if isinstance(value, Mapping):
        return {k: _engine_value((*where, str(k)), v, user, paths, fs, allow_trust, found) for k, v in value.items()}
    if isinstance(value, list):
        # A list of paths under a path key (lora folders) keeps that key's meaning.
        return [_engine_value((*where, i), v, user, paths, fs, allow_trust, found) for i, v in enumerate(value)]
    if not isinstance(value, str):
        return value
    key_name = last or (str(where[-2]).lower() if len(where) > 1 else "")
    label = ".".join(str(w) for w in where)
    problems, rewritten = _path_value(label, key_name, value, user, paths, fs, hydra=False)
    found.extend((where, p.split(": ", 1)[1] if p.startswith(f"`{label}`: ") else p) for p in problems)
    return rewritten


def is_code_engine_key(key: str) -> bool:
    """True when the engine argument ``key`` (any depth, lower case) names code or code-as-config
    for vLLM to load (see :data:`CODE_ENGINE_KEYS`)."""
    return key in CODE_ENGINE_KEYS or bool(_CODE_ENGINE_SUFFIX.search(key))


# Environment variables that make Python, the dynamic loader, torch, triton, transformers or vLLM
# load or run code, or config-as-code, from a location: the same trust as trust_remote_code.
#
# This is a deny-list by category, not an allow-list of plain knobs: vLLM 0.32 alone reads ~316
# variables, and torch, triton, NCCL, CUDA, transformers and glibc many more, and users already
# set names argus cannot enumerate (HF_TOKEN, their own); so instead of listing what is safe, every
# name that is or may be a location (a *_PATH/_DIR/_HOME/_ROOT/_FILE/_CACHE/_CONFIG..., a plugin,
# a module, a library) or belongs to a loader/interpreter/compiler family needs the trust flag.
# A plain knob that only looks like one (a size in _MB, ...) stays open, and so does a plain value
# (a level, a count, a flag such as VLLM_CONFIGURE_LOGGING, a backend name from vLLM's registry).
CODE_ENV = frozenset(
    {"LD_PRELOAD", "LD_AUDIT", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE"}
    | {"VLLM_PLUGINS", "VLLM_LOGGING_CONFIG_PATH", "HF_MODULES_CACHE"}
    | {"HOME", "PATH", "CC", "CXX", "CPATH", "ENV", "BASH_ENV", "GCONV_PATH", "TMPDIR", "TMP", "TEMP"}
    | {"HF_HOME", "TRANSFORMERS_CACHE", "TORCH_HOME", "CUDA_HOME", "CUDA_CACHE_PATH", "XDG_CACHE_HOME"}
    | {"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "VLLM_CACHE_ROOT", "VLLM_CONFIG_ROOT"}
)
_CODE_ENV_PREFIX = ("LD_", "DYLD_", "PYTHON", "TORCHINDUCTOR_", "TRITON_", "XDG_", "OPENSSL_", "GIT_", "BASH_")
_CODE_ENV_WORD = re.compile(
    r"(^|_)(PLUGINS?|MODULES?|EXTENSIONS?|CACHE|HOME|ROOT|PATH|DIR|FOLDER|PREFIX|FILE|LIB|LIBS|SO|CONF|CONFIG)(_|$)"
)
# A last word that makes the variable a quantity, not a location (VLLM_XGRAMMAR_CACHE_MB).
_QUANTITY = re.compile(r"_(MB|GB|KB|BYTES|SIZE|HOURS|SECONDS|MS|TTL|SPACE|LEN)$")
_CODE_ENV_WHY = (
    f"may make the replica load code or config-as-code from a location, with the cluster's credentials; {_ALLOW}"
)


def is_code_env(name: str) -> bool:
    """True when the environment variable ``name`` needs ``serving.allow_trust_remote_code`` (see
    :data:`CODE_ENV`)."""
    upper = name.strip().upper()
    if upper in CODE_ENV or upper.startswith(_CODE_ENV_PREFIX):
        return True
    return bool(_CODE_ENV_WORD.search(upper)) and not _QUANTITY.search(upper)


def check_model_env(
    env: Mapping[str, str],
    *,
    user: str,
    paths: Paths,
    fs: FileSystem | None,
    allow_trust_remote_code: bool = False,
) -> tuple[dict[str, str], list[Finding]]:
    """Check a model's ``env``: a path value goes through the path policy (``$HOME`` expanded), and
    a variable that loads code (``LD_PRELOAD``, ``PYTHONPATH``, ...) is the same trust as
    ``trust_remote_code``. Returns the env as it reaches the replica and ``((name,), message)`` per
    refusal. Never raises."""
    out: dict[str, str] = {}
    found: list[Finding] = []
    for name, value in env.items():
        out[name] = value
        problems: list[str] = []
        if isinstance(value, str) and _PATH_PREFIX.match(value):
            problems, out[name] = _path_value(name, "", value, user, paths, fs, hydra=False)
            found.extend(((name,), p.split(": ", 1)[1]) for p in problems)
        # A path outside the roots is already refused; one inside the user's home is where the
        # user writes the code, so a code variable needs the trust flag wherever it points.
        if not problems and is_code_env(name) and not allow_trust_remote_code:
            found.append(((name,), _LOADS_WHY if name.strip().upper() in _LOADS else _CODE_ENV_WHY))
    return out, found


# Variables that load code by definition (the message says so plainly).
_LOADS = frozenset(
    {"LD_PRELOAD", "LD_AUDIT", "PYTHONPATH", "PYTHONSTARTUP", "VLLM_PLUGINS", "VLLM_LOGGING_CONFIG_PATH"}
)
_LOADS_WHY = f"loads code into the replica process, with the cluster's credentials; {_ALLOW}"
