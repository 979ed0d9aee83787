"""The daemon, re-exported: the tick lives in :mod:`reconciler.tick`, the loop in
:mod:`reconciler.loop`, the report (status, log lines, metrics) in :mod:`reconciler.report`."""

from reconciler.loop import Daemon
from reconciler.report import Reporter
from reconciler.tick import SECRET_ENV_NAMES, Reconciler, TickResult, default_task_check

__all__ = ["SECRET_ENV_NAMES", "Daemon", "Reconciler", "Reporter", "TickResult", "default_task_check"]
