"""One exception tree for argus, with structured data.

Errors are classified the kopf way: a :class:`PermanentError` cannot heal by retrying
(bad input, a refused request) and is reported until its input changes; a
:class:`TemporaryError` (an unreachable dashboard, a failed fetch) is retried with a delay.
"""

from __future__ import annotations

from dataclasses import dataclass


class ArgusError(Exception):
    """Base of every error argus raises on purpose."""


class PermanentError(ArgusError):
    """Retrying the same input gives the same failure; wait for the input to change."""


class TemporaryError(ArgusError):
    """May heal by itself; retry after ``delay`` seconds (a hint, not a promise)."""

    def __init__(self, message: str, delay: float = 5.0) -> None:
        super().__init__(message)
        self.delay = delay


@dataclass(frozen=True, order=True)
class Issue:
    """One problem with the desired state, located as ``path:line``.

    ``line`` is 1-based; 0 means the problem is about the file as a whole. ``column`` is 1-based
    where the parser gives one (a YAML syntax error), else 0.
    """

    path: str
    line: int
    message: str
    column: int = 0

    @property
    def where(self) -> str:
        """``path:line:column``, ``path:line`` or ``path`` (as editors and CI annotations read it)."""
        if not self.line:
            return self.path
        return f"{self.path}:{self.line}:{self.column}" if self.column else f"{self.path}:{self.line}"

    def __str__(self) -> str:
        return f"{self.where}: {self.message}"

    def to_json(self) -> dict[str, object]:
        """The issue as JSON; ``column`` only when known."""
        out: dict[str, object] = {"path": self.path, "line": self.line, "message": self.message}
        if self.column:
            out["column"] = self.column
        return out


class InvalidSpec(PermanentError):
    """The desired state has errors; ``issues`` lists every one of them."""

    def __init__(self, issues: list[Issue]) -> None:
        super().__init__("\n".join(str(i) for i in issues))
        self.issues = issues


class SourceUnavailable(TemporaryError):
    """The git source could not be read (fetch failed, branch missing, ...). Nothing is deleted."""


class RayUnavailable(TemporaryError):
    """The Ray dashboard (Jobs or Serve REST API) did not answer. Nothing is applied."""


class ConcurrentWrite(TemporaryError):
    """Another writer moved a ref argus was updating (compare-and-swap lost): re-read, retry."""


class ApplyFailed(ArgusError):
    """Ray refused an action. ``permanent`` tells whether retrying the same request can help."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


class ConfigError(PermanentError):
    """The daemon's own configuration is unusable (reported at start-up; the daemon exits)."""
