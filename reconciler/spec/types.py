"""Dataclasses of the desired state, as loaded from a config repository."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from reconciler.errors import Issue

Kind = Literal["model", "task"]
Workload = Literal["ppo", "grpo", "sft", "command"]


class ObjectKey(NamedTuple):
    """Identity of one object: ``users/<user>/<kind>s/<name>.yaml``.

    A named tuple, not a dataclass: keys are hashed and compared millions of times when
    planning 10,000 objects, and tuple hashing and ordering run in C.
    """

    user: str
    kind: Kind
    name: str

    @property
    def path(self) -> str:
        return f"users/{self.user}/{self.kind}s/{self.name}.yaml"

    def __str__(self) -> str:
        return f"{self.user}/{self.kind}s/{self.name}"

    def __repr__(self) -> str:
        return f"ObjectKey({self.user!r}, {self.kind!r}, {self.name!r})"

    @classmethod
    def parse(cls, text: str) -> ObjectKey:
        """Parse ``user/models/name`` (or ``user/tasks/name``). Raises ValueError."""
        user, kinds, name = text.split("/")
        if kinds not in ("models", "tasks"):
            raise ValueError(f"not an object key: {text!r}")
        kind: Kind = "model" if kinds == "models" else "task"
        return cls(user, kind, name)


@dataclass(frozen=True)
class UserPolicy:
    gpus: int | None = None  # quota; None = unlimited
    tasks: int | None = None  # most tasks running at once (each driver takes a driver slot); None = unlimited
    # On the OpenAI endpoint, per minute; None: serving.limits' default (enforced only with API keys).
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt + completion


# Quota resources: GPUs, and driver slots (one per active task: every task's driver takes
# `training.driver_resources`, a resource only worker nodes offer).
GPU = "GPU"
SLOTS = "tasks"
QUOTA_RESOURCES = (GPU, SLOTS)
NO_TEAM = ""  # the queue of users in no team: nominal quota 0, so all it runs is borrowed


@dataclass(frozen=True)
class Team:
    """A team (Kueue's ClusterQueue in the cluster's one cohort): members and quotas.

    ``nominal``: quota resource -> amount the team is guaranteed (reclaimed by preemption
    when others borrowed it). ``borrowing_limit``: most it may use beyond ``nominal`` (absent
    resource: unlimited). ``lending_limit``: most of its idle ``nominal`` others may borrow
    (absent: all of it). ``priority_classes``: the classes its members may use (None: all).
    """

    name: str
    members: tuple[str, ...] = ()
    nominal: Mapping[str, float] = field(default_factory=dict)
    borrowing_limit: Mapping[str, float] = field(default_factory=dict)
    lending_limit: Mapping[str, float] = field(default_factory=dict)
    weight: float = 1.0
    priority_classes: tuple[str, ...] | None = None
    # The members together on the OpenAI endpoint, per minute; None: no team limit.
    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None

    def guaranteed(self, resource: str) -> float:
        """The part of the nominal quota never lent."""
        nominal = self.nominal.get(resource, 0.0)
        lend = self.lending_limit.get(resource)
        return 0.0 if lend is None else max(0.0, nominal - lend)

    def max_quota(self, resource: str) -> float | None:
        """Nominal plus borrowing limit; None = no limit."""
        limit = self.borrowing_limit.get(resource)
        return None if limit is None else self.nominal.get(resource, 0.0) + limit


@dataclass(frozen=True)
class Preemption:
    """When waiting work may stop running work (``preemption:`` in cluster.yaml).

    ``reclaim`` (Kueue's reclaimWithinCohort): a team asking for its nominal quota may stop
    work of other teams that borrow: ``Any`` priority, only ``LowerPriority``, or ``Never``.
    ``within_team`` (withinClusterQueue): ``LowerPriority`` work of the same team, or ``Never``.
    ``min_run_seconds``: a task younger than this is never preempted (hysteresis).
    ``models``: whether model replicas above a model's ``min_replicas`` may be preempted.
    """

    reclaim: Literal["Any", "LowerPriority", "Never"] = "Any"
    within_team: Literal["LowerPriority", "Never"] = "LowerPriority"
    min_run_seconds: int = 0
    models: bool = False


@dataclass(frozen=True)
class Paths:
    common: str = "/private/hf"
    users: str = "/private/users"


@dataclass(frozen=True)
class RouterSettings:
    """Autoscaling of the one OpenAI router application (scaled through Serve's `deployments`
    override, so changing these never restarts a router replica)."""

    min_replicas: int = 2  # two by default: losing one replica drops no request
    max_replicas: int = 8
    target_ongoing_requests: float = 16.0


@dataclass(frozen=True)
class Limits:
    """``serving.limits``: each user's default rate limits on the OpenAI endpoint, per minute
    (None: unlimited). ``users.<u>`` overrides them for one user; enforced only with API keys."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None  # prompt + completion


@dataclass(frozen=True)
class Serving:
    accelerator: Literal["gpu", "cpu"] = "gpu"
    accelerator_type: str | None = None
    http_port: int = 8000  # argus's OpenAI endpoint (reconciler/endpoint), where clients call
    internal_http_port: int = 8001  # Ray Serve's own proxy, called only by the endpoint and the prober
    proxy_location: str = "HeadOnly"
    cpus_per_replica: float = 1.0
    # Code in a model folder would run in the replica with the cluster's credentials.
    allow_trust_remote_code: bool = False
    router: RouterSettings = field(default_factory=RouterSettings)
    # Who may call a model whose file has no `access:` (users or teams; "*": everyone with a key).
    # None: everyone with an API key. Enforced only with a keys file (argus daemon --api-keys).
    default_access: tuple[str, ...] | None = None
    limits: Limits = field(default_factory=Limits)
    # Serve applications argus does not own that may keep an HTTP route (a job's ``serve.run`` or
    # PUT): every other foreign app with a route is removed on the next tick (reconciler/plan/serve_kept.py).
    allowed_apps: tuple[str, ...] = ()
    # The dashboard of a Ray cluster of its own that models run on (None: the cluster tasks run on).
    # Its token comes from the daemon's environment (ARGUS_SERVING_RAY_TOKEN), never the repository.
    ray_address: str | None = None


# verl tasks save every this many optimizer steps unless cluster.yaml says otherwise: what a preempted
# run loses at most. One save costs about a minute for a 7B model with its optimizer state; at 50 steps
# that is a small fraction of an SFT run (seconds a step) and bounds an RL run (a minute a step) to
# under an hour of lost work. docs/reference/cluster-yaml.md has the trade-off.
CHECKPOINT_EVERY_STEPS = 50


@dataclass(frozen=True)
class Training:
    rollout: str = "vllm"
    driver_resources: Mapping[str, float] = field(default_factory=lambda: {"worker_node": 1.0})
    # trainer.save_freq of every verl task; a task's own trainer.save_freq may only lower it.
    checkpoint_every_steps: int = CHECKPOINT_EVERY_STEPS


@dataclass(frozen=True)
class Prune:
    max_fraction: float = 0.5
    min_deletions: int = 3


@dataclass(frozen=True)
class Admission:
    """How waiting work is admitted (``admission:`` in cluster.yaml).

    BestEffortFIFO (default, as Kueue's): oldest first, but a later request that fits may start
    while an earlier one waits for more resources. StrictFIFO: once a request waits for a
    resource, every later request for that resource waits behind it (no starvation of big jobs).
    """

    policy: Literal["BestEffortFIFO", "StrictFIFO"] = "BestEffortFIFO"


@dataclass(frozen=True)
class Storage:
    """Per-user disk quotas on the users' folders (``storage:`` in cluster.yaml), in GiB. While a user's
    folder holds more than hers, no new run of her tasks is submitted (reconciler.plan.disk)."""

    user_quota_gb: float | None = None  # every user's; None: no limit
    users: Mapping[str, float | None] = field(default_factory=dict)  # one user's own (None: no limit)

    def quota_gb(self, user: str) -> float | None:
        """``user``'s quota in GiB; None: no limit."""
        return self.users.get(user, self.user_quota_gb)

    @property
    def any(self) -> bool:
        """True when some user has a quota."""
        return self.user_quota_gb is not None or any(v is not None for v in self.users.values())


@dataclass(frozen=True)
class Security:
    require_signed_commits: bool = False
    allowed_signers: str | None = None
    admins: tuple[str, ...] = ()


@dataclass(frozen=True)
class ClusterSpec:
    """``cluster.yaml``; every field has a default, so a missing file means ``ClusterSpec()``."""

    users: Mapping[str, UserPolicy] | None = None  # None: any user may have a folder
    paths: Paths = field(default_factory=Paths)
    serving: Serving = field(default_factory=Serving)
    training: Training = field(default_factory=Training)
    env: Mapping[str, str] = field(default_factory=lambda: {"HF_HUB_OFFLINE": "1"})
    prune: Prune = field(default_factory=Prune)
    security: Security = field(default_factory=Security)
    admission: Admission = field(default_factory=Admission)
    teams: Mapping[str, Team] = field(default_factory=dict)
    priority_classes: Mapping[str, int] = field(default_factory=dict)  # name -> value
    default_priority: Mapping[str, str] = field(default_factory=dict)  # "model"/"task" -> class name
    # The classes users in no team may use; None: with teams, each kind's default class only
    # (:meth:`no_team_classes`); without teams, every class.
    no_team_priority_classes: tuple[str, ...] | None = None
    preemption: Preemption = field(default_factory=Preemption)
    storage: Storage = field(default_factory=Storage)

    def quota(self, user: str) -> int | None:
        if self.users is None:
            return None
        policy = self.users.get(user)
        return policy.gpus if policy else None

    def task_limit(self, user: str) -> int | None:
        """Most tasks ``user`` may run at once (driver slots); None = no limit."""
        policy = self.users.get(user) if self.users is not None else None
        return policy.tasks if policy else None

    def team_of(self, user: str) -> str:
        """The team ``user`` is a member of, or NO_TEAM."""
        memo: dict[str, str] | None = self.__dict__.get("_argus_members")
        if memo is None:
            memo = {m: t.name for t in self.teams.values() for m in t.members}
            object.__setattr__(self, "_argus_members", memo)  # frozen: memoised like a cached property
        return memo.get(user, NO_TEAM)

    def no_team_classes(self, kind: str) -> tuple[str, ...] | None:
        """The priority classes a user in no team may use for an object of ``kind`` ("model" or
        "task"); None: any. The admin's ``no_team_priority_classes``, else with teams declared
        only the kind's default class (none when it has none), else (no teams: everyone is in
        no team) any."""
        if self.no_team_priority_classes is not None:
            return self.no_team_priority_classes
        if not self.teams:
            return None
        default = self.default_priority.get(kind)
        return (default,) if default else ()

    def priority_value(self, kind: str, name: str | None) -> int:
        """The value of priority class ``name`` (or the kind's default); 0 when none is declared."""
        chosen = name or self.default_priority.get(kind)
        return self.priority_classes.get(chosen, 0) if chosen else 0


@dataclass(frozen=True)
class ModelSpec:
    """A served model. ``source_path`` is the resolved local folder (None when unresolved:
    offline validation, or a ``task:`` source, resolved by the planner from actual state)."""

    key: ObjectKey
    source: str
    source_path: str | None
    source_task: str | None
    replicas: int
    gpus_per_replica: int
    engine_kwargs: Mapping[str, object]
    env: Mapping[str, str]
    suspend: bool
    created_at: int  # UTC epoch seconds of the commit that added the file
    line: int = 1  # line of `source`, for messages
    priority: str | None = None  # priority class; None: the cluster's default for models
    min_replicas: int | None = None  # replicas never preempted; None: the model is never preempted
    alias_field: str | None = None  # `served_name:` as written (None: the default alias)
    alias_line: int = 1  # line of `served_name` (of `source` without one), for messages
    may_wait: bool = False  # the author accepts UNSCHEDULABLE (the PR check warns, not fails); not hashed
    # Line of what sizes the request (`replicas`/`gpus_per_replica`, the first written; `source`
    # without them), for quota messages.
    size_line: int = 1
    # `access:` as written: who besides the owner may call it through the router (users or teams;
    # "*": everyone with a key). None: cluster.yaml's serving.default_access. Not hashed: the router
    # learns a change in place, the model's replicas never restart for it.
    access: tuple[str, ...] | None = None

    @property
    def served_name(self) -> str:
        return served_name(self.key.user, self.key.name, self.created_at)

    @property
    def alias(self) -> str:
        """The stable OpenAI name: ``served_name:`` of the file, else ``<user>-<name>``."""
        return self.alias_field or f"{self.key.user}-{self.key.name}"

    def access_in(self, cluster: ClusterSpec) -> tuple[str, ...] | None:
        """Who besides the owner may call this model (users or teams) under ``cluster``: its
        ``access:``, else ``serving.default_access``; None (or a list holding "*"): everyone with
        an API key."""
        access = self.access if self.access is not None else cluster.serving.default_access
        return None if access is None or "*" in access else access


@dataclass(frozen=True)
class TaskSpec:
    """A training task. Paths are resolved (macros expanded, HF ids mapped to snapshots when online)."""

    key: ObjectKey
    workload: Workload
    model: str | None
    model_path: str | None
    data_train: str | None
    data_val: str | None
    nodes: int
    gpus_per_node: int
    epochs: int | None  # passes over the data; None when the file gives none (then `steps`, or one pass)
    steps: int | None  # optimizer steps; None when the file gives none
    overrides: tuple[str, ...]
    override_lines: tuple[int, ...]
    command: str | None
    working_dir: str | None
    env: Mapping[str, str]
    run: int
    suspend: bool
    created_at: int
    raw: Mapping[str, object] = field(default_factory=dict, compare=False)  # normalised spec, for the hash
    priority: str | None = None  # priority class; None: the cluster's default for tasks
    may_wait: bool = False  # the author accepts UNSCHEDULABLE (the PR check warns, not fails); not hashed
    # Python's user site-packages in the user's folder is loaded (builders.jobs.isolation_env); hashed when true.
    user_site: bool = False
    # Line of what sizes the request (`nodes`/`gpus_per_node`, the first written; `kind` without
    # them), for quota messages.
    size_line: int = 1

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


@dataclass
class DesiredState:
    """Everything read from the repository at one revision.

    ``invalid`` holds objects whose file exists but does not load: the planner keeps
    what runs for them. ``issues`` holds every error found, for reports.

    ``serial`` and ``changed`` are a change feed, set by the incremental loader and compared by
    nothing: ``serial`` tells its successive states apart (0: not one of them), ``changed`` is
    (the serial of the state this one follows, the objects whose spec, invalidity or issues may
    differ from it; every other object's spec is the very same object). A state that carries
    them is never changed after it is made, so a planner that saw the one it follows may look
    at those objects alone.
    """

    cluster: ClusterSpec
    models: dict[ObjectKey, ModelSpec] = field(default_factory=dict)
    tasks: dict[ObjectKey, TaskSpec] = field(default_factory=dict)
    invalid: dict[ObjectKey, list[Issue]] = field(default_factory=dict)
    issues: list[Issue] = field(default_factory=list)
    cluster_valid: bool = True
    revision: str | None = None
    approve_prune: bool = False
    skipped: list[str] = field(default_factory=list)  # checks that did not run on it (said by the CLI)
    # Not init fields: a state made from another (dataclasses.replace) is no longer the loader's.
    serial: int = field(default=0, compare=False, init=False)
    changed: tuple[int, frozenset[ObjectKey]] | None = field(default=None, compare=False, init=False)

    @property
    def object_count(self) -> int:
        return len(self.models) + len(self.tasks)

    def keys(self) -> set[ObjectKey]:
        return set(self.models) | set(self.tasks) | set(self.invalid)


def served_name(user: str, name: str, created_at: int) -> str:
    """The OpenAI ``model=`` name: ``<user>-<YYYYMMDDHHMM>-<name>`` (UTC)."""
    import time

    stamp = time.strftime("%Y%m%d%H%M", time.gmtime(created_at))
    return f"{user}-{stamp}-{name}"
