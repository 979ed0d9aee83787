"""One exception tree for argus, with structured data.

Errors are classified the kopf way, by subclass only: a :class:`PermanentError` cannot heal by
retrying (bad input, a refused request) and is reported until its input changes; a
:class:`TemporaryError` (an unreachable dashboard, a failed fetch) is retried, no sooner than
its ``delay`` (the loop's and the applier's back-off, :mod:`reconciler.backoff`, never retry
earlier). Every exception argus raises on purpose is defined here.
"""

from __future__ import annotations

from dataclasses import dataclass


class ArgusError(Exception):
    """Base of every error argus raises on purpose."""


class PermanentError(ArgusError):
    """Retrying the same input gives the same failure; wait for the input to change."""


class TemporaryError(ArgusError):
    """May heal by itself; retry no sooner than ``delay`` seconds (the class's ``DELAY`` unless
    the raiser knows better)."""

    DELAY = 5.0

    def __init__(self, message: str, delay: float | None = None) -> None:
        super().__init__(message)
        self.delay = self.DELAY if delay is None else delay


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


class GitError(SourceUnavailable):
    """A git command failed, could not start or ran past its timeout (:mod:`reconciler.git`).

    A :class:`SourceUnavailable`: the repository (the config branches, or argus's own status
    refs in it) cannot be read or written now; nothing is deleted and the tick is retried.
    ``command`` is the command after ``git -C repo``, ``returncode`` its exit status (None when it
    did not exit by itself), ``stderr`` what it said."""

    def __init__(
        self, message: str, args: tuple[str, ...] = (), returncode: int | None = None, stderr: str = ""
    ) -> None:
        super().__init__(message)
        self.command = args
        self.returncode = returncode
        self.stderr = stderr


class RayUnavailable(TemporaryError):
    """The Ray dashboard (Jobs or Serve REST API) did not answer. Nothing is applied."""

    DELAY = 1.0  # a head that restarts answers within seconds: the back-off grows from here


class DashboardError(ArgusError):
    """The dashboard answered with an HTTP error (``status``, the body as ``text``); whether
    that is permanent depends on the request (the applier classifies it)."""

    def __init__(self, method: str, path: str, status: int, text: str) -> None:
        super().__init__(f"{method} {path}: HTTP {status}: {text[:500]}")
        self.status = status
        self.text = text


class ConcurrentWrite(TemporaryError):
    """Another writer moved a ref argus was updating (compare-and-swap lost): re-read, retry."""


class StatusBranchBlocked(TemporaryError):
    """The status branch cannot be created in the repository argus writes: another ref is named like
    a folder above it or lies under it (git cannot store both). Not a lost race: retrying changes
    nothing until someone removes that ref, so nothing that needs a record is applied meanwhile."""


class ApplyFailed(ArgusError):
    """An action did not take: always one of :class:`ApplyRefused` (permanent) or
    :class:`ApplyDeferred` (temporary)."""

    @property
    def permanent(self) -> bool:
        return isinstance(self, PermanentError)


class ApplyRefused(ApplyFailed, PermanentError):
    """Ray refused the request itself: the same request fails the same way until the spec changes."""


class ApplyDeferred(ApplyFailed, TemporaryError):
    """Ray could not take the request now (unreachable, overloaded, a transient error): retried."""

    DELAY = 2.0


class ConfigError(PermanentError):
    """The daemon's own configuration is unusable (reported at start-up; the daemon exits)."""


class YamlError(PermanentError):
    """A YAML document cannot be read; ``issue`` locates the problem."""

    def __init__(self, issue: Issue) -> None:
        super().__init__(str(issue))
        self.issue = issue


class PathError(PermanentError, ValueError):
    """A path breaks the path policy; the message says why, for the user."""


class LogNotFound(PermanentError, LookupError):
    """The object has no such run or application, or Ray does not say it is the object's."""


class MissingExtra(PermanentError):
    """A command needs a module only a runtime extra installs (the base install has only
    validate, plan, status and init)."""
