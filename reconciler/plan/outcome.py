"""What applying one object came to, and how it shows in the object's status. Pure.

The applier returns one :class:`Outcome` per object it touched; :func:`with_outcomes` is the one
place where an apply failure enters an object's status (its health and sync come from Ray and the
plan: :func:`reconciler.plan.assess.assess`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from reconciler.plan.assess import ObjectStatus
from reconciler.spec.types import ObjectKey


@dataclass(frozen=True)
class Outcome:
    """``applied``: a step for this object reached Ray this tick. ``error``: the last step that
    failed, with ``permanent`` (not retried until the file changes) or ``retry_in`` (seconds until
    the next try; None: the next tick)."""

    applied: bool = False
    error: str | None = None
    permanent: bool = False
    retry_in: float | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None

    def succeeded(self) -> Outcome:
        return replace(self, applied=True)

    def failing(self, error: str, *, permanent: bool = False, retry_in: float | None = None) -> Outcome:
        return replace(self, error=error, permanent=permanent, retry_in=retry_in)


def with_outcomes(
    statuses: Mapping[ObjectKey, ObjectStatus],
    outcomes: Mapping[ObjectKey, Outcome],
    invalid: Mapping[ObjectKey, object],
) -> dict[ObjectKey, ObjectStatus]:
    """Each object's status with its apply failure in it. Returns new statuses (the given ones are
    not changed). An object none of whose steps reached Ray is FAILED unless what runs for it
    still serves (RUNNING, DEPLOYING: kept as it runs); the reason says what failed."""
    out = dict(statuses)
    for key, outcome in outcomes.items():
        status = out.get(key)
        if status is None or outcome.error is None:
            continue
        state = status.state
        if not outcome.applied and key not in invalid and state not in ("RUNNING", "DEPLOYING"):
            state = "FAILED"
        why = f"apply failed: {outcome.error}"
        out[key] = replace(status, state=state, reason=f"{status.reason}; {why}" if status.reason else why)
    return out
