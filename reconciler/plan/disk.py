"""Per-user disk quotas (cluster.yaml ``storage``): which tasks wait while their user's folder is over. Pure.

Every user's folder (``<paths.users>/<user>``) sits on one shared file system: her uploads and her jobs'
run folders and checkpoints. The daemon measures each folder off the tick (:mod:`reconciler.observe.disk`)
and hands the tick the last complete measurement per user (:class:`DiskUsage`). A user whose folder holds
more than her quota, or could not be measured whole, gets no new run: her tasks that the planner would
submit (a new spec, a bumped ``run:``, a preempted run's next attempt) are planned as suspended, which
keeps what runs exactly as it runs (:func:`hold`), and their status says why (:func:`explain`). Nothing
is stopped: a running job's checkpoints are what the user most wants to keep, and stopping it would
free nothing by itself. A folder not measured yet (a daemon just started) holds nothing back.

The hard limit (what uploads and running jobs may write) is the file system's project quota, which
the kernel enforces per folder whoever writes (docs/admins/operations.md); this check keeps a user
who is over it, or over a soft limit the admin sets here, from starting more work meanwhile.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, replace

from reconciler.plan.actual import ActualState
from reconciler.plan.assess import ObjectStatus
from reconciler.plan.planner import runs_by_key, task_step
from reconciler.spec.types import ClusterSpec, DesiredState, ObjectKey

GIB = 1 << 30


@dataclass(frozen=True)
class DiskUsage:
    """One complete measurement of a user's folder: ``used`` bytes of disk (allocated blocks, as ``du``
    counts them), and ``problem`` when part of it could not be counted (then ``used`` is a lower bound)."""

    used: int
    problem: str | None = None


def measured_users(desired: DesiredState) -> frozenset[str]:
    """The users whose folders the daemon measures: those with a task file and a quota (none when
    cluster.yaml sets no quota)."""
    storage = desired.cluster.storage
    if not storage.any:
        return frozenset()
    return frozenset(u for u in {k.user for k in desired.tasks} if storage.quota_gb(u) is not None)


def _gib(used: int) -> str:
    return f"{used / GIB:.1f} GB"


def over_quota(cluster: ClusterSpec, usage: Mapping[str, DiskUsage]) -> dict[str, str]:
    """Why each user over her quota gets no new run (user -> reason), from ``usage``, the last complete
    measurement of each user's folder. Rounded to 0.1 GB: the reason changes when the size does."""
    out: dict[str, str] = {}
    for user, use in usage.items():
        limit = cluster.storage.quota_gb(user)
        if limit is None:
            continue
        folder = posixpath.join(cluster.paths.users, user)
        if use.problem is not None:
            out[user] = (
                f"disk quota: {folder} could not be measured whole ({use.problem}; {_gib(use.used)} counted), "
                f"so no new run of {user}'s starts until it can be; what runs keeps running"
            )
        elif use.used > limit * GIB:
            out[user] = (
                f"disk quota: {folder} holds {_gib(use.used)}, over {user}'s quota of {limit:g} GB "
                "(cluster.yaml storage); no new run starts until it is under: delete files over sftp or rsync "
                "(old run folders under jobs/ too); what runs keeps running"
            )
    return out


def held_tasks(desired: DesiredState, actual: ActualState, over: Mapping[str, str]) -> dict[ObjectKey, str]:
    """The tasks of the users in ``over`` that the planner would submit now (:func:`task_step` makes a
    submission of them), each with its user's reason. Empty when nobody is over (no pass over the tasks)."""
    if not over:
        return {}
    runs = runs_by_key(actual)
    cluster, foreign = desired.cluster, actual.foreign_ids
    out: dict[ObjectKey, str] = {}
    for key, spec in desired.tasks.items():
        if key.user not in over or spec.suspend:
            continue
        if task_step(key, spec, runs.get(key, []), None, cluster, foreign).action is not None:
            out[key] = over[key.user]
    return out


def hold(desired: DesiredState, held: Mapping[ObjectKey, str]) -> DesiredState:
    """``desired`` with the tasks in ``held`` suspended: planned as kept exactly as they run. A new state
    (the loader's change feed does not describe it); ``desired`` is not changed."""
    tasks = {k: replace(v, suspend=True) if k in held else v for k, v in desired.tasks.items()}
    return replace(desired, tasks=tasks)


def explain(statuses: Mapping[ObjectKey, ObjectStatus], held: Mapping[ObjectKey, str]) -> dict[ObjectKey, ObjectStatus]:
    """``statuses`` with each held task's status saying why it waits: QUEUED (argus holds it) unless a
    run of it says otherwise (a preempted attempt stays PREEMPTED), out of sync, the quota's reason."""
    out = dict(statuses)
    for key, why in held.items():
        status = out.get(key)
        if status is not None:
            state = "QUEUED" if status.state == "SUSPENDED" else status.state
            out[key] = replace(status, state=state, sync="OutOfSync", reason=why)
    return out
