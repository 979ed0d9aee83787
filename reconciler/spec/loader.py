"""Load the desired state from repository files. Pure: takes file contents, returns data.

Reading the files (from a git commit or a directory) is :mod:`reconciler.source`'s job.
Every error of every file is collected (never only the first), one user's broken file
never blocks another user's objects, and parsing is cached per blob so a re-plan after
one changed file re-parses only that file.
"""

from __future__ import annotations

import posixpath
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from reconciler.errors import Issue
from reconciler.spec import schema
from reconciler.spec.aliases import clashes, namespace_problem
from reconciler.spec.overrides import check_engine_kwargs, check_model_env, check_overrides, field_name
from reconciler.spec.paths import FileSystem, PathError, resolve_path, resolve_source
from reconciler.spec.types import (
    GPU,
    SLOTS,
    Admission,
    ClusterSpec,
    DesiredState,
    Kind,
    Limits,
    ModelSpec,
    ObjectKey,
    Paths,
    Preemption,
    Prune,
    RouterSettings,
    Security,
    Serving,
    Storage,
    TaskSpec,
    Team,
    Training,
    UserPolicy,
    Workload,
)
from reconciler.spec.yamldoc import MAX_BYTES, Document, YamlError, parse

# No "--", no trailing "-", and every "-"-separated part of a user name starts with a letter:
# this makes every name argus derives injective (reconciler/spec/hashing.py, "Derived names").
USER_RE = re.compile(r"^(?=.{1,31}$)[a-z][a-z0-9]*(?:-[a-z][a-z0-9]*)*$")
NAME_RE = re.compile(r"^(?=.{1,63}$)[a-z0-9]+(?:-[a-z0-9]+)*$")
USER_RULE = "lowercase letters and digits, parts joined by single '-', each part starting with a letter, <= 31"
NAME_RULE = "lowercase letters and digits, parts joined by single '-', <= 63"
KIND_OF_FOLDER = {"models": "Model", "tasks": "Task"}
IGNORED_NAMES = {".gitkeep", ".keep"}

# A check that needs more than the spec (verl's config tree): returns (line, message) pairs.
TaskCheck = Callable[[TaskSpec, ClusterSpec], list[tuple[int, str]]]
# A check of a model against vLLM's engine arguments (the table of the vLLM that cluster.serving.accelerator
# runs): returns (field path in the file, message) pairs.
ModelCheck = Callable[[ModelSpec, ClusterSpec], list[tuple[tuple[str | int, ...], str]]]


@dataclass(frozen=True)
class SourceFile:
    """One file of the repository. ``blob`` identifies the content (git blob id or a hash)."""

    path: str
    content: bytes | None
    blob: str
    symlink: bool = False
    # Bytes, when the source knows them without the content (a git tree listing): a file over
    # the limit comes with content None and is reported without ever being read.
    size: int | None = None


CACHE_BYTES = 32 * 1024 * 1024  # 10,000 typical objects take about 11 MB of it


@dataclass
class ParseCache:
    """Parsed-and-schema-checked documents by (path, blob): unchanged blobs are not re-parsed.

    Bounded in bytes, not entries: ``max_bytes`` of source text across ``entries`` and ``built``
    (a parsed document takes some ten times its text). A file that does not fit is parsed each
    time instead; entries of files no longer in the tree are dropped at the end of a load.
    """

    entries: dict[tuple[str, str], tuple[Document | None, list[Issue]]] = field(default_factory=dict)
    parsed: int = 0  # how many files were actually parsed (for benchmarks)
    max_bytes: int = CACHE_BYTES
    weights: dict[object, int] = field(default_factory=dict)  # entries' and built's keys -> source bytes
    bytes: int = 0
    # Offline (fs=None), or on a file system whose answers are frozen per generation: built objects
    # by (path, blob, created, cluster.yaml blob, checks, task-source present), each with the
    # file system's generation it was built in (a hit needs the same one; a file's object of
    # another generation is replaced), and the ClusterSpec by cluster.yaml blob, so that unchanged
    # objects (and their memoised spec hashes, see reconciler.spec.hashing) are reused as they are
    # by the next load.
    built: dict[tuple[object, ...], tuple[object, ModelSpec | TaskSpec | None, list[Issue]]] = field(
        default_factory=dict
    )
    clusters: dict[str, ClusterSpec] = field(default_factory=dict)
    keys: dict[str, tuple[ObjectKey | None, str | None]] = field(default_factory=dict)

    def remember(self, table: dict[Any, Any], key: object, value: object, weight: int) -> None:
        """Store ``value`` in ``table`` (``entries`` or ``built``) when its weight still fits."""
        if key in table or self.bytes + weight > self.max_bytes:
            return
        table[key] = value
        self.weights[key] = weight
        self.bytes += weight

    def keep_basis(self, cluster_blob: str | None, checks: tuple[int | None, int | None]) -> None:
        """Forget the built objects of another cluster.yaml or checks: their keys are not looked
        up again until cluster.yaml or the checks change back."""
        if any(k[3] != cluster_blob or k[4] != checks for k in self.built):
            keep = {k for k in self.built if k[3] == cluster_blob and k[4] == checks}
            self.keep_only(set(self.entries), keep)

    def keep_only(self, entries: set[tuple[str, str]], built: set[tuple[object, ...]]) -> None:
        """Forget every entry but ``entries`` and ``built`` (what the current tree uses)."""
        self.entries = {k: v for k, v in self.entries.items() if k in entries}
        self.built = {k: v for k, v in self.built.items() if k in built}
        self.weights = {k: w for k, w in self.weights.items() if k in self.entries or k in self.built}
        self.bytes = sum(self.weights.values())


def load(
    files: Iterable[SourceFile],
    *,
    created: Mapping[str, int] | None = None,
    default_time: int = 0,
    fs: FileSystem | None = None,
    cache: ParseCache | None = None,
    task_check: TaskCheck | None = None,
    model_check: ModelCheck | None = None,
    revision: str | None = None,
    approve_prune: bool = False,
    resolve_clashes: bool = True,
    prune: bool = True,
) -> DesiredState:
    """Return the :class:`DesiredState` of ``files``. Never raises for bad input: every
    problem becomes an Issue in ``state.issues`` (and the object lands in ``state.invalid``).

    ``created`` maps a path to the UTC epoch of the commit that added it (``default_time``
    for paths it lacks); ``fs`` enables the file-system checks (None = offline).
    ``resolve_clashes=False`` leaves served-name clashes between models unresolved and
    ``prune=False`` keeps ``cache`` as it is: for loading one part of a tree
    (:mod:`reconciler.spec.incremental` resolves the clashes of all parts together).
    """
    created = created or {}
    cache = cache if cache is not None else ParseCache()
    by_path = {f.path: f for f in files}
    issues: list[Issue] = []

    cluster, cluster_valid = ClusterSpec(), True
    if "cluster.yaml" in by_path:
        cluster_doc, cluster_issues = _parse_checked(by_path["cluster.yaml"], "Cluster", cache)
        if cluster_doc is not None and not cluster_issues:
            blob = by_path["cluster.yaml"].blob
            try:
                cluster = cache.clusters.get(blob) or cache.clusters.setdefault(blob, cluster_from(cluster_doc.data))
            except (TypeError, ValueError, KeyError, AttributeError) as exc:
                # Schema-valid data should always build; if it does not, the file is invalid, not the load.
                cluster_issues = [Issue("cluster.yaml", 1, f"cannot use cluster.yaml: {exc}")]
                cluster = ClusterSpec()
            router = cluster.serving.router
            if cluster_issues:
                cluster_valid = False
            elif router.max_replicas < router.min_replicas:
                cluster_issues = [
                    Issue(
                        "cluster.yaml",
                        cluster_doc.line(("serving", "router", "max_replicas")),
                        f"serving.router.max_replicas: {router.max_replicas} is below min_replicas "
                        f"({router.min_replicas})",
                    )
                ]
                cluster, cluster_valid = ClusterSpec(), False
            elif scheduling := scheduling_issues(cluster, cluster_doc):
                cluster_issues = scheduling
                cluster, cluster_valid = ClusterSpec(), False
        else:
            cluster_valid = False
        issues.extend(cluster_issues)

    objects: dict[ObjectKey, SourceFile] = {}
    undeclared: dict[ObjectKey, list[Issue]] = {}
    held: dict[ObjectKey, list[Issue]] = {}
    for path in by_path:  # issues are sorted at the end; objects are keyed, not ordered
        if not path.startswith("users/"):
            continue
        hit = cache.keys.get(path)
        key, problem = hit if hit is not None else cache.keys.setdefault(path, classify(path))
        if key is None:
            if problem:
                issue = Issue(shown_path(path), 0, problem)
                issues.append(issue)
                claim = claimed_key(path)
                if claim is not None and claim.path not in by_path:
                    held.setdefault(claim, []).append(issue)  # invalid, not absent: what runs for it is kept
            continue
        if cluster.users is not None and key.user not in cluster.users:
            issue = Issue(path, 0, f"user {key.user!r} is not declared under `users:` in cluster.yaml")
            issues.append(issue)
            undeclared[key] = [issue]  # invalid, not absent: what runs for it is kept, never deleted
            continue
        objects[key] = by_path[path]

    state = DesiredState(cluster=cluster, cluster_valid=cluster_valid, revision=revision, approve_prune=approve_prune)
    state.invalid.update(held)
    state.invalid.update(undeclared)
    task_names = {(k.user, k.name) for k in objects if k.kind == "task"}
    cluster_blob = by_path["cluster.yaml"].blob if "cluster.yaml" in by_path else None
    used: list[tuple[object, ...]] = []
    checks = check_ids(task_check, model_check)
    for key, file in objects.items():
        doc, file_issues = _parse_checked(file, KIND_OF_FOLDER[key.kind + "s"], cache)
        when = created.get(file.path, default_time)
        memo: tuple[object, ...] | None = None
        # Offline, or a file system whose answers are frozen per generation (reconciler.fscache):
        # then the built object is a pure function of the key and the generation, and unchanged
        # files are not rebuilt.
        generation = getattr(fs, "generation", None)
        if (fs is None or generation is not None) and doc is not None:
            source = doc.data.get("source")
            has_task = isinstance(source, str) and source.startswith("task:") and (key.user, source[5:]) in task_names
            # The layout ParseCache.keep_basis reads: (path, blob, when, cluster blob, checks, has_task).
            memo = (file.path, file.blob, when, cluster_blob, checks, has_task)
            used.append(memo)
            built = cache.built.get(memo)
            if built is not None and built[0] == generation:
                _, spec, file_issues = built
                if isinstance(spec, ModelSpec):
                    state.models[key] = spec
                elif isinstance(spec, TaskSpec):
                    state.tasks[key] = spec
                if file_issues:
                    state.invalid[key] = file_issues
                    issues.extend(file_issues)
                continue
        if doc is not None:
            # Schema violations do not stop the file: the fields they are in are skipped and every
            # other field is still checked, so one round of fixes clears every independent problem.
            schema_issues = file_issues
            try:
                if key.kind == "model":
                    model, file_issues = _model(key, doc, cluster, fs, when, task_names, model_check, schema_issues)
                    if model is not None:
                        state.models[key] = model
                else:
                    task, file_issues = _task(key, doc, cluster, fs, when, task_check, schema_issues)
                    if task is not None:
                        state.tasks[key] = task
            except Exception as exc:  # pragma: no cover - a bug must not take down other users
                file_issues = [*schema_issues, Issue(file.path, 0, f"internal error while loading: {exc!r}")]
            if memo is not None:
                built_spec = state.models.get(key) or state.tasks.get(key)
                if memo in cache.built:  # the object of another generation: it would never be a hit again
                    cache.built[memo] = (generation, built_spec, file_issues)
                else:
                    cache.remember(cache.built, memo, (generation, built_spec, file_issues), _weight(file))
        if file_issues:
            state.invalid[key] = file_issues
            issues.extend(file_issues)
    if resolve_clashes:
        issues.extend(drop_clashes(state, clashes(state.models.values())))
    if not prune:
        state.issues = sorted(set(issues))
        return state
    # A long-running daemon: forget what is no longer in the tree before it crowds out what is
    # (not after every load: rebuilding the tables costs what a re-plan after one push costs).
    dead = (
        len(cache.entries) > len(by_path) + len(by_path) // 8 + 64 or len(cache.built) > len(used) + len(used) // 8 + 64
    )
    full = cache.bytes > cache.max_bytes - cache.max_bytes // 8 and len(cache.entries) > len(by_path)
    if dead or full:
        cache.keep_only({(f.path, f.blob) for f in by_path.values()}, set(used))
    if len(cache.keys) > 2 * len(by_path) + 1024:
        cache.keys = {p: k for p, k in cache.keys.items() if p in by_path}
    state.issues = sorted(set(issues))
    return state


def check_ids(task_check: TaskCheck | None, model_check: ModelCheck | None) -> tuple[int | None, int | None]:
    """Which checks a built object was checked with, as its cache key holds them."""
    return (id(task_check) if task_check else None, id(model_check) if model_check else None)


def drop_clashes(state: DesiredState, found: Mapping[ObjectKey, tuple[str, ModelSpec]]) -> list[Issue]:
    """Move the models of ``found`` (see :func:`~reconciler.spec.aliases.clashes`) from
    ``state.models`` to ``state.invalid``; returns their issues."""
    out = []
    for key, (name, holder) in found.items():
        model = state.models.pop(key)
        issue = Issue(key.path, model.alias_line, f"served name {name!r} is already used by {holder.key.path}")
        state.invalid[key] = [issue]
        out.append(issue)
    return out


def classify(path: str) -> tuple[ObjectKey | None, str | None]:
    """Map a path under ``users/`` to its object key (names checked); or (None, problem), or
    (None, None) for files that are ignored."""
    if not _plain(path):
        return None, (
            "the path holds control or invisible characters, a backslash or bytes that are not UTF-8 "
            "(shown escaped); object files are users/<user>/models/<name>.yaml and users/<user>/tasks/<name>.yaml"
        )
    key, problem = _classify(path)
    if key is None:
        return key, problem
    # fullmatch: `$` would also match before a final newline ("chat\n" is not a name).
    if not USER_RE.fullmatch(key.user):
        return None, f"user folder {key.user!r} must match {USER_RULE}{_name_hint(key.user, 31)}"
    if not NAME_RE.fullmatch(key.name):
        return None, f"file name {key.name!r}.yaml must match {NAME_RULE}{_name_hint(key.name, 63)}"
    return key, None


def _name_hint(name: str, limit: int) -> str:
    """What is wrong with ``name`` in a few words (``: it is 70 characters``), for a name that
    breaks its rule; empty when no single cause stands out."""
    if len(name) > limit:
        return f": it is {len(name)} characters"
    if name != name.lower():
        return ": it has capital letters"
    if "_" in name:
        return ": use '-' instead of '_'"
    if " " in name:
        return ": it has a space"
    if "." in name:
        return ": it has a '.' (only the final .yaml may)"
    return ""


def claimed_key(path: str) -> ObjectKey | None:
    """The object an invalid file under ``users/`` still names, or None.

    A file in ``users/<user>/models/`` or ``users/<user>/tasks/``, at any depth, whose name up to
    its first dot is a valid object name holds ``users/<user>/<kind>s/<name>.yaml``: ``chat.yml``,
    ``chat.yaml.bak`` or ``old/chat.yaml`` after ``chat.yaml`` was renamed keep the object ``chat``
    as it runs (reported invalid) rather than deleting it. A file directly under ``users/<user>/``
    names no kind and holds nothing.
    """
    parts = path.split("/")
    if len(parts) < 4 or parts[0] != "users" or parts[2] not in KIND_OF_FOLDER or not _plain(path):
        return None
    name = parts[-1].split(".", 1)[0]
    if not USER_RE.fullmatch(parts[1]) or not NAME_RE.fullmatch(name):
        return None
    kind: Kind = "model" if parts[2] == "models" else "task"
    return ObjectKey(parts[1], kind, name)


def _plain(path: str) -> bool:
    """True when ``path`` can be shown as it is: printable, no backslash, valid UTF-8 (no surrogates)."""
    return path.isprintable() and "\\" not in path


def shown_path(path: str) -> str:
    """``path`` as it can be printed on one line: unchanged when plain, else with every control or
    invisible character, backslash and non-UTF-8 byte (a lone surrogate from ``surrogateescape``)
    escaped the way Python's repr escapes them (``\\n``, ``\\x01``, ``\\xe9``, ``\\u202e``)."""
    if _plain(path):
        return path
    out = []
    for char in path:
        code = ord(char)
        if 0xDC80 <= code <= 0xDCFF:
            out.append(f"\\x{code - 0xDC00:02x}")
        elif char == "\\":
            out.append("\\\\")
        elif char.isprintable():
            out.append(char)
        else:
            out.append(repr(char)[1:-1])
    return "".join(out)


def _weight(file: SourceFile) -> int:
    """What caching ``file``'s parse costs, in source bytes (plus a small constant per entry)."""
    return 256 + (len(file.content) if file.content is not None else 0)


def _classify(path: str) -> tuple[ObjectKey | None, str | None]:
    """Map a path under ``users/`` to its object key; or (None, problem) / (None, None) to ignore."""
    parts = path.split("/")
    if len(parts) == 2:
        return None, "files directly under users/ are not allowed; use users/<user>/models/ or users/<user>/tasks/"
    if len(parts) == 3:
        if parts[2] in IGNORED_NAMES:
            return None, None
        return (
            None,
            f"files directly under users/{parts[1]}/ are not allowed; put models in models/ and tasks in tasks/",
        )
    folder = parts[2]
    if folder not in KIND_OF_FOLDER:
        return None, f"unknown folder {folder!r} under users/{parts[1]}/; only models/ and tasks/ are allowed"
    if len(parts) > 4:
        return None, f"sub-folders are not allowed in {folder}/; put <name>.yaml directly in users/{parts[1]}/{folder}/"
    filename = parts[3]
    if filename in IGNORED_NAMES:
        return None, None
    if filename.endswith(".yml"):
        return None, "use the .yaml extension (.yml files are not loaded)"
    if not filename.endswith(".yaml"):
        return None, f"only <name>.yaml files are allowed in {folder}/"
    kind: Kind = "model" if folder == "models" else "task"
    # Interned: the user's name is in each of its objects' keys, and keys sit in every table.
    return ObjectKey(sys.intern(parts[1]), kind, filename[: -len(".yaml")]), None


def _parse_checked(file: SourceFile, kind: str, cache: ParseCache) -> tuple[Document | None, list[Issue]]:
    """Parse and schema-check one file, through the cache."""
    hit = cache.entries.get((file.path, file.blob))
    if hit is not None:
        return hit
    cache.parsed += 1
    result: tuple[Document | None, list[Issue]]
    size = file.size if file.size is not None else (len(file.content) if file.content is not None else None)
    if file.symlink:
        result = (None, [Issue(file.path, 0, "symlinks are not allowed in the config repository")])
    elif size is not None and size > MAX_BYTES:
        result = (None, [Issue(file.path, 0, f"file is {size} bytes; the limit is {MAX_BYTES} (256 KiB)")])
    elif file.content is None:
        result = (None, [Issue(file.path, 0, "not a regular file")])
    else:
        try:
            result = _read(file.path, file.content, kind)
        except Exception as exc:  # a bug must not take down other users
            result = (None, [Issue(file.path, 0, f"internal error while reading this file: {exc!r}")])
    cache.remember(cache.entries, (file.path, file.blob), result, _weight(file))
    return result


def _read(path: str, content: bytes, kind: str) -> tuple[Document | None, list[Issue]]:
    """Parse and schema-check one file's content."""
    try:
        doc = parse(path, content)
    except YamlError as exc:
        issue = exc.issue
        if issue.line and not issue.message.startswith("file is "):
            issue = replace(issue, message=issue.message + STOPPED)
        return None, [issue]
    found = doc.data.get("kind")
    if "kind" in doc.data and found != kind:
        # Checked against the wrong schema, every other message would be noise.
        folder = {"Model": "models/", "Task": "tasks/", "Cluster": "the repository root (cluster.yaml)"}[kind]
        message = f"kind: must be {kind!r} for a file in {folder}, got {schema.described(doc, ('kind',))}{STOPPED}"
        return None, [Issue(path, doc.line(("kind",)), message)]
    return doc, schema.validate(doc, kind)


# Every Serve application argus owns is named ``argus…`` (reconciler/builders/serve.py): such a name
# cannot be allowed to another application (serving.allowed_apps).
ARGUS_APP_NAMESPACE = "argus"

# Said by the errors after which a file is not read further (what follows would be meaningless).
STOPPED = " (the rest of this file is checked once this is fixed)"


def cluster_from(data: Mapping[str, Any]) -> ClusterSpec:
    """Build a ClusterSpec from schema-valid data, applying the documented defaults."""
    users = None
    if "users" in data:
        users = {
            u: UserPolicy(
                gpus=(p or {}).get("gpus"),
                tasks=(p or {}).get("tasks"),
                requests_per_minute=(p or {}).get("requests_per_minute"),
                tokens_per_minute=(p or {}).get("tokens_per_minute"),
            )
            for u, p in (data["users"] or {}).items()
        }
    paths = Paths(**data.get("paths", {}))
    serving_data = dict(data.get("serving", {}))
    if "router" in serving_data:
        serving_data["router"] = RouterSettings(**serving_data["router"])
    if serving_data.get("default_access") is not None:
        serving_data["default_access"] = tuple(serving_data["default_access"])
    if "limits" in serving_data:
        serving_data["limits"] = Limits(**(serving_data["limits"] or {}))
    if "allowed_apps" in serving_data:
        serving_data["allowed_apps"] = tuple(serving_data["allowed_apps"] or ())
    serving = Serving(**serving_data)
    training_data = dict(data.get("training", {}))
    if "driver_resources" in training_data:
        training_data["driver_resources"] = {k: float(v) for k, v in training_data["driver_resources"].items()}
    training = Training(**training_data)
    env = dict(data["env"]) if "env" in data else {"HF_HUB_OFFLINE": "1"}
    prune = Prune(**data.get("prune", {}))
    sec = dict(data.get("security", {}))
    if "admins" in sec:
        sec["admins"] = tuple(sec["admins"])
    security = Security(**sec)
    admission = Admission(**data.get("admission", {}))
    teams = {
        name: Team(
            name=name,
            members=tuple(t.get("members", ())),
            nominal=_quota(t.get("quota")),
            borrowing_limit=_quota(t.get("borrowing_limit")),
            lending_limit=_quota(t.get("lending_limit")),
            weight=float(t.get("weight", 1)),
            priority_classes=tuple(t["priority_classes"]) if "priority_classes" in t else None,
            requests_per_minute=t.get("requests_per_minute"),
            tokens_per_minute=t.get("tokens_per_minute"),
        )
        for name, t in (data.get("teams") or {}).items()
    }
    defaults = data.get("default_priority") or {}
    storage_data = data.get("storage") or {}
    storage = Storage(
        user_quota_gb=storage_data.get("user_quota_gb"),
        users={u: (None if v is None else float(v)) for u, v in (storage_data.get("users") or {}).items()},
    )
    return ClusterSpec(
        teams=teams,
        priority_classes={k: int(v) for k, v in (data.get("priority_classes") or {}).items()},
        default_priority={kind: defaults[kind + "s"] for kind in ("model", "task") if kind + "s" in defaults},
        no_team_priority_classes=(
            tuple(data["no_team_priority_classes"]) if "no_team_priority_classes" in data else None
        ),
        preemption=Preemption(**data.get("preemption", {})),
        users=users,
        paths=paths,
        serving=serving,
        training=training,
        env=env,
        prune=prune,
        security=security,
        admission=admission,
        storage=storage,
    )


def _quota(data: Mapping[str, Any] | None) -> dict[str, float]:
    """cluster.yaml's ``{gpus, tasks}`` as quota resources."""
    names = {"gpus": GPU, "tasks": SLOTS}
    return {names[k]: float(v) for k, v in (data or {}).items()}


def access_issues(doc: Document, where: tuple[str | int, ...], cluster: ClusterSpec, names: object) -> list[Issue]:
    """An access list's names that are neither a user nor a team of ``cluster`` (checked only when
    cluster.yaml declares its users: an open cluster's users are not known), one path:line issue
    each. A typo would silently keep out the user it meant. Pure."""
    if not isinstance(names, list) or cluster.users is None:
        return []
    known = set(cluster.users) | set(cluster.teams) | {"*"}
    return [
        _at(doc, (*where, i), f"{name!r} is neither a user nor a team in cluster.yaml")
        for i, name in enumerate(names)
        if isinstance(name, str) and name not in known
    ]


def scheduling_issues(cluster: ClusterSpec, doc: Document) -> list[Issue]:
    """Cross-references of teams and priority classes the schema cannot check, as path:line issues."""
    out: list[Issue] = []
    out.extend(
        access_issues(
            doc, ("serving", "default_access"), cluster, (doc.data.get("serving") or {}).get("default_access")
        )
    )
    for i, name in enumerate(cluster.serving.allowed_apps):
        if name.startswith(ARGUS_APP_NAMESPACE):
            out.append(
                _at(
                    doc,
                    ("serving", "allowed_apps", i),
                    f"{name!r} is in argus's own namespace ({ARGUS_APP_NAMESPACE}*): argus keeps its "
                    "applications as it declares them and never lets another take their names",
                )
            )
    classes = cluster.priority_classes
    seen: dict[str, str] = {}
    for name, team in sorted(cluster.teams.items()):
        for i, member in enumerate(team.members):
            where = ("teams", name, "members", i)
            if cluster.users is not None and member not in cluster.users:
                out.append(_at(doc, where, f"user {member!r} is not declared under `users:`"))
            elif member in seen:
                out.append(_at(doc, where, f"user {member!r} is already a member of team {seen[member]!r}"))
            else:
                seen[member] = name
        for i, cls in enumerate(team.priority_classes or ()):
            if cls not in classes:
                out.append(_at(doc, ("teams", name, "priority_classes", i), f"no priority class {cls!r}"))
    for kind, cls in sorted(cluster.default_priority.items()):
        if cls not in classes:
            out.append(_at(doc, ("default_priority", kind + "s"), f"no priority class {cls!r}"))
    for i, cls in enumerate(cluster.no_team_priority_classes or ()):
        if cls not in classes:
            out.append(_at(doc, ("no_team_priority_classes", i), f"no priority class {cls!r}"))
    return out


def priority_issue(doc: Document, cluster: ClusterSpec, user: str, kind: str, chosen: object) -> Issue | None:
    """Why ``user`` may not run an object of ``kind`` at priority ``chosen`` (her own or the default), else None."""
    name = chosen if isinstance(chosen, str) else cluster.default_priority.get(kind)
    if name is None:
        return None
    where: tuple[str | int, ...] = ("priority",) if isinstance(chosen, str) else ("kind",)
    if name not in cluster.priority_classes:
        known = ", ".join(sorted(cluster.priority_classes)) or "none are declared"
        return _at(doc, where, f"no priority class {name!r} in cluster.yaml ({known})")
    team = cluster.teams.get(cluster.team_of(user))
    if team is not None:
        if team.priority_classes is not None and name not in team.priority_classes:
            allowed = ", ".join(team.priority_classes) or "none"
            return _at(doc, where, f"team {team.name!r} may not use priority class {name!r} (it may use: {allowed})")
        return None
    # A user in no team shares one queue with every other such user: an open choice of class
    # would let her preempt their work with a class no team of hers was granted.
    free = cluster.no_team_classes(kind)
    if free is not None and name not in free:
        allowed = ", ".join(free) or "none"
        why = f"{user} is in no team and may not use priority class {name!r} (users in no team may use: {allowed}"
        return _at(doc, where, f"{why}; `no_team_priority_classes` in cluster.yaml)")
    return None


def _model(
    key: ObjectKey,
    doc: Document,
    cluster: ClusterSpec,
    fs: FileSystem | None,
    when: int,
    task_names: set[tuple[str, str]],
    model_check: ModelCheck | None = None,
    schema_issues: Sequence[Issue] = (),
) -> tuple[ModelSpec | None, list[Issue]]:
    """Build the model, or return None and every problem of the file (``schema_issues`` first:
    the fields they are in are skipped, every other field is still checked)."""
    data, _ = _usable(doc, "Model", schema_issues)
    issues = list(schema_issues)
    source: str | None = data.get("source")
    line = doc.line(("source",))
    source_path: str | None = None
    source_task: str | None = None
    if source is None:
        pass  # missing or malformed: already reported
    elif source.startswith("task:"):
        source_task = source[len("task:") :]
        if not NAME_RE.fullmatch(source_task):
            issues.append(Issue(doc.path, line, f"source: {source!r}: task name must match {NAME_RULE}"))
        elif (key.user, source_task) not in task_names:
            issues.append(Issue(doc.path, line, f"source: no task users/{key.user}/tasks/{source_task}.yaml"))
    else:
        try:
            source_path = resolve_source(source, key.user, cluster.paths, fs)
        except PathError as exc:
            issues.append(Issue(doc.path, line, f"source: {exc}"))
    engine_kwargs, engine_refused = check_engine_kwargs(
        data.get("engine_kwargs", {}),
        user=key.user,
        paths=cluster.paths,
        fs=fs,
        allow_trust_remote_code=cluster.serving.allow_trust_remote_code,
    )
    env, env_refused = check_model_env(
        data.get("env", {}),
        user=key.user,
        paths=cluster.paths,
        fs=fs,
        allow_trust_remote_code=cluster.serving.allow_trust_remote_code,
    )
    refused = [(("engine_kwargs", *where), m) for where, m in engine_refused]
    refused += [(("env", *where), m) for where, m in env_refused]
    issues.extend(_at(doc, where, message) for where, message in refused)
    written = data.get("served_name")
    alias_field = written if isinstance(written, str) and written else None  # a bad type is the schema's error
    alias_line = doc.line(("served_name",)) if alias_field else line
    alias = alias_field or f"{key.user}-{key.name}"
    problem = namespace_problem(alias, key.user, cluster.users or ())
    if problem and alias_field:
        issues.append(_at(doc, ("served_name",), f"{alias!r} {problem}"))
    elif problem:
        issues.append(Issue(doc.path, line, f"the default alias {alias!r} {problem}: set `served_name:`"))
    bad_priority = priority_issue(doc, cluster, key.user, "model", data.get("priority"))
    if bad_priority:
        issues.append(bad_priority)
    model = ModelSpec(
        key=key,
        source=source or "",
        source_path=source_path,
        source_task=source_task,
        replicas=data.get("replicas", 1),
        gpus_per_replica=data.get("gpus_per_replica", 1),
        engine_kwargs=engine_kwargs,
        env=env,
        suspend=bool(data.get("suspend", False)),
        created_at=when,
        line=line,
        may_wait=bool(data.get("may_wait", False)),
        priority=data.get("priority"),
        min_replicas=data.get("min_replicas"),
        alias_field=alias_field,
        alias_line=alias_line,
        size_line=size_line(doc, ("replicas", "gpus_per_replica"), line),
        access=tuple(data["access"]) if isinstance(data.get("access"), list) else None,
    )
    issues.extend(access_issues(doc, ("access",), cluster, data.get("access")))
    if model_check is not None:
        # vLLM's table judges only what argus's own rules let through (a refused key is reported once).
        refused_keys = {where[1] for where, _ in refused if where[0] == "engine_kwargs" and len(where) > 1}
        checked = {k: v for k, v in engine_kwargs.items() if k not in refused_keys}
        if checked:
            from dataclasses import replace as with_fields

            found = model_check(with_fields(model, engine_kwargs=checked), cluster)
            issues.extend(_at(doc, where, message) for where, message in found)
    if issues:
        return None, _ordered(issues)
    return model, []


def _usable(
    doc: Document, kind: str, schema_issues: Sequence[Issue]
) -> tuple[dict[str, Any], set[tuple[str | int, ...]]]:
    """``doc``'s data without the fields that hold a schema violation, and those fields' paths.

    A violation one level down (``engine_kwargs.x``, ``env.X``, ``data.train``) drops only that
    entry; list items (``overrides[3]``) stay in place, listed in the returned paths, so the other
    items keep their indices (and lines)."""
    data = _integral(doc.data)
    if not schema_issues:
        return data, set()
    bad = schema.invalid_paths(doc, kind)
    for where in bad:
        if len(where) == 1:
            data.pop(str(where[0]), None)
        elif isinstance(data.get(str(where[0])), dict):
            inner = dict(data[str(where[0])])
            inner.pop(str(where[1]), None)
            data[str(where[0])] = inner
    return data, bad


def size_line(doc: Document, keys: Sequence[str], default: int) -> int:
    """The line of the first of ``keys`` written in ``doc`` (what a quota message points at: the
    request's size), else ``default``."""
    lines = [doc.lines[(k,)] for k in keys if (k,) in doc.lines]
    return min(lines) if lines else default


def _ordered(issues: list[Issue]) -> list[Issue]:
    """Each issue once, by line (the order a reader fixes them in)."""
    return sorted(set(issues))


def _at(doc: Document, where: tuple[str | int, ...], message: str) -> Issue:
    """An Issue at ``where``'s line, its message prefixed with the field (``engine_kwargs.x: ...``)."""
    return Issue(doc.path, doc.line(where), f"{field_name(where)}: {message}")


TASK_DEFAULTS: dict[str, Any] = {"nodes": 1, "gpus_per_node": 1, "env": {}, "run": 1}
TRAINER_DEFAULTS: dict[str, Any] = {"epochs": 1, "overrides": []}


INTEGER_FIELDS = ("replicas", "min_replicas", "gpus_per_replica", "nodes", "gpus_per_node", "epochs", "steps", "run")


def _integral(data: Mapping[str, Any]) -> dict[str, Any]:
    """JSON Schema counts ``1.0`` as an integer; make it ``1`` so the spec hash agrees with ``1``."""
    out = dict(data)
    for name in INTEGER_FIELDS:
        value = out.get(name)
        if isinstance(value, float) and value.is_integer():
            out[name] = int(value)
    return out


def _task(
    key: ObjectKey,
    doc: Document,
    cluster: ClusterSpec,
    fs: FileSystem | None,
    when: int,
    task_check: TaskCheck | None,
    schema_issues: Sequence[Issue] = (),
) -> tuple[TaskSpec | None, list[Issue]]:
    """Build the task, or return None and every problem of the file (``schema_issues`` first:
    the fields they are in are skipped, every other field is still checked, verl's config included)."""
    data, bad = _usable(doc, "Task", schema_issues)
    issues: list[Issue] = list(schema_issues)
    workload: Workload | None = data.get("workload")
    raw = {**TASK_DEFAULTS, **({} if workload == "command" else TRAINER_DEFAULTS), **data}
    if raw.get("user_site") is False:  # the default: hashed like a file without it (a new key re-runs nothing)
        del raw["user_site"]

    def checked(field_path: tuple[str, ...], value: str | None, *, hf: bool = False) -> str | None:
        if value is None:
            return None
        try:
            if hf:
                return resolve_source(value, key.user, cluster.paths, fs)
            return resolve_path(value, key.user, cluster.paths, fs)
        except PathError as exc:
            issues.append(Issue(doc.path, doc.line(field_path), f"{'.'.join(field_path)}: {exc}"))
            return None

    model_path = checked(("model",), data.get("model"), hf=True)
    data_files = data.get("data", {})
    train = checked(("data", "train"), data_files.get("train"))
    val = checked(("data", "val"), data_files.get("val"))
    working_dir = checked(("working_dir",), data.get("working_dir"))
    if "HOME" in data.get("env", {}):
        home = posixpath.join(cluster.paths.users, key.user)
        issues.append(
            _at(doc, ("env", "HOME"), f"argus sets HOME to your own folder ({home}) for every job; remove it")
        )
    if workload == "command" and data.get("nodes", 1) != 1:
        issues.append(
            Issue(doc.path, doc.line(("nodes",)), "nodes: workload: command runs on a single node (nodes: 1)")
        )
    # Items with a schema violation (not `a.b=value`) are skipped; the others keep their index and line.
    overrides_all = list(data.get("overrides", []))
    kept = [i for i, text in enumerate(overrides_all) if ("overrides", i) not in bad and isinstance(text, str)]
    # A malformed size is reported already; check parallel sizes against the largest legal one meanwhile.
    nodes = raw["nodes"] if ("nodes",) not in bad else 64
    gpus_per_node = raw["gpus_per_node"] if ("gpus_per_node",) not in bad else 8
    overrides_out, refused = check_overrides(
        [overrides_all[i] for i in kept],
        user=key.user,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        paths=cluster.paths,
        fs=fs,
        allow_trust_remote_code=cluster.serving.allow_trust_remote_code,
    )
    issues.extend(_at(doc, ("overrides", kept[i]), message) for i, message in refused)
    bad_priority = priority_issue(doc, cluster, key.user, "task", data.get("priority"))
    if bad_priority:
        issues.append(bad_priority)
    refused_at = {i for i, _ in refused}
    # verl composes only what argus's own rules accept (each problem is reported once).
    composed = [n for n in range(len(kept)) if n not in refused_at]
    task = TaskSpec(
        key=key,
        workload=workload or "command",
        model=data.get("model"),
        model_path=model_path,
        data_train=train,
        data_val=val,
        nodes=raw["nodes"],
        gpus_per_node=raw["gpus_per_node"],
        # None when the file does not say: `steps` alone then bounds the run (builders.jobs.epoch_bounds).
        # `raw` keeps the default `epochs: 1` the hash has always covered (a changed hash re-runs a task),
        # so `steps: N` and `steps: N, epochs: 1` hash alike although the second may stop after one pass.
        epochs=data.get("epochs"),
        steps=data.get("steps"),
        overrides=tuple(overrides_out[n] for n in composed),
        override_lines=tuple(doc.line(("overrides", kept[n])) for n in composed),
        command=data.get("command"),
        working_dir=working_dir,
        env=dict(data.get("env", {})),
        run=raw["run"],
        suspend=bool(data.get("suspend", False)),
        created_at=when,
        # None of them says what runs (`priority` is scheduling): changing them never re-runs the task.
        raw={k: v for k, v in raw.items() if k not in ("suspend", "may_wait", "priority")},
        may_wait=bool(data.get("may_wait", False)),
        priority=data.get("priority"),
        user_site=bool(data.get("user_site", False)),
        size_line=size_line(doc, ("nodes", "gpus_per_node"), doc.line(("kind",))),
    )
    # A malformed size or epoch count stands at its default here: verl's compose does not judge them.
    if task_check is not None and workload is not None and workload != "command":
        issues.extend(Issue(doc.path, line, message) for line, message in task_check(task, cluster))
    if issues:
        return None, _ordered(issues)
    return task, []
