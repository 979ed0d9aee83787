"""argus's entry around verl's for a task bounded by both ``steps`` and ``epochs``. Runs inside the
task's Ray Job (its driver, and every worker through Ray's ``worker_process_setup_hook``); imports
nothing else of argus's, and nothing of verl's until verl's own entry does.

verl's trainers (verl 0.9.1: ``SFTTrainer``, ``RayPPOTrainer`` and the v1 ``PPOTrainer``) loop over
``range(total_epochs)`` epochs and stop, saving, once the step reaches ``total_training_steps``. With
both bounds set, when the epochs end first the loop just runs out: no last step, no last checkpoint.
The steps in an epoch are known only once the trainer built its data loader, so this entry lowers
the trainer's step bound to ``total_epochs x steps per epoch`` when ``fit`` starts: whichever comes
first is then the last step, and verl saves there as it always does.

The learning-rate schedule was planned for ``total_training_steps`` before that (verl builds it with
the model); the docs say so. A verl without the attributes this relies on makes the job fail with
that said, never train without its last checkpoint.

Usage (what :func:`reconciler.builders.jobs.verl_argv` renders)::

    python3 -m reconciler.job_apps.verl_entry verl.trainer.sft_trainer_ray <hydra overrides...>
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Sequence
from typing import Any

# verl's entry modules argus runs, and the trainer classes whose ``fit`` each module (or one it
# imports in a Ray actor) defines.
ENTRIES = ("verl.trainer.sft_trainer_ray", "verl.trainer.main_ppo")
TRAINERS: dict[str, tuple[str, ...]] = {
    "verl.trainer.sft_trainer_ray": ("SFTTrainer",),
    "verl.trainer.ppo.ray_trainer": ("RayPPOTrainer",),
    "verl.trainer.ppo.v1.trainer_base": ("PPOTrainer",),
}
_MARK = "_argus_bounded"


class VerlMismatch(RuntimeError):
    """The installed verl lacks what the step bound relies on (a class, ``fit``, a step count)."""


def epoch_steps(trainer: Any) -> int:
    """Return the steps the trainer's epochs hold: ``total_epochs x steps per epoch`` (verl's
    ``steps_per_epoch``, else the train data loader's length). Raises VerlMismatch when the
    trainer has neither or they are not numbers."""
    per_epoch = getattr(trainer, "steps_per_epoch", None)
    if per_epoch is None:
        loader = getattr(trainer, "train_dataloader", None)
        if loader is None:
            raise VerlMismatch(f"{type(trainer).__name__} has neither steps_per_epoch nor train_dataloader")
        per_epoch = len(loader)
    try:
        return int(trainer.config.trainer.total_epochs) * int(per_epoch)
    except (AttributeError, TypeError, ValueError) as exc:
        raise VerlMismatch(f"{type(trainer).__name__}: cannot count the steps of its epochs ({exc!r})") from exc


def bound(trainer: Any) -> int:
    """Lower ``trainer.total_training_steps`` to the steps its epochs hold when those come first.

    Returns the step bound now in force. Raises VerlMismatch when the trainer has no step bound
    or no step count (see :func:`epoch_steps`)."""
    steps = getattr(trainer, "total_training_steps", None)
    if not isinstance(steps, int):
        raise VerlMismatch(f"{type(trainer).__name__}.total_training_steps is {steps!r}, not a step count")
    cap = epoch_steps(trainer)
    if 0 < cap < steps:
        print(
            f"argus: the epochs end after {cap} steps, before steps: {steps}; step {cap} is the last "
            f"(whichever comes first), and verl saves its checkpoint there",
            flush=True,
        )
        trainer.total_training_steps = cap
        return cap
    return steps


def wrap(cls: type) -> None:
    """Make ``cls.fit`` call :func:`bound` first (once: wrapping twice changes nothing).
    Raises VerlMismatch when ``cls`` has no ``fit``."""
    fit = getattr(cls, "fit", None)
    if not callable(fit):
        raise VerlMismatch(f"{cls.__module__}.{cls.__name__} has no fit()")
    if getattr(fit, _MARK, False):
        return

    @functools.wraps(fit)
    def bounded_fit(self: Any, *args: Any, **kwargs: Any) -> Any:
        bound(self)
        return fit(self, *args, **kwargs)

    setattr(bounded_fit, _MARK, True)
    cls.fit = bounded_fit  # type: ignore[attr-defined]


def _patch(module: types.ModuleType) -> None:
    """Wrap the trainer classes ``module`` defines. Raises VerlMismatch when one is missing."""
    for name in TRAINERS.get(module.__name__, ()):
        cls = getattr(module, name, None)
        if not isinstance(cls, type):
            raise VerlMismatch(f"{module.__name__} has no class {name}: argus's step bound needs verl 0.9.1")
        wrap(cls)


class _PatchingLoader(importlib.abc.Loader):
    """Loads a trainer module with its own loader, then wraps its trainer classes."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        self._inner.exec_module(module)
        _patch(module)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... (inspect, linecache)
        return getattr(self._inner, name)


class _TrainerFinder(importlib.abc.MetaPathFinder):
    """Finds the trainer modules through the other finders and hands them to :class:`_PatchingLoader`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in TRAINERS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec: importlib.machinery.ModuleSpec | None = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader)
                return spec
        return None


def install() -> None:
    """Wrap the trainers' ``fit`` in this process: those already imported now, the others when they
    are imported. Ray calls it in every worker of the job (``worker_process_setup_hook``), so it is
    cheap where no trainer runs: it imports nothing of verl's (a finder waits for the trainer modules).
    Raises VerlMismatch (an imported trainer module
    lacks its class)."""
    for name in TRAINERS:
        module = sys.modules.get(name)
        if module is not None:
            _patch(module)
    if not any(isinstance(f, _TrainerFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _TrainerFinder())


def main(argv: Sequence[str] | None = None, *, run: Callable[[types.ModuleType], Any] | None = None) -> int:
    """Run verl's entry module ``argv[0]`` with the hydra overrides ``argv[1:]``, trainers bounded.

    ``run`` calls the entry (default: the module's hydra ``main()``, which reads ``sys.argv``).
    Returns 0; exits with 2 for an entry that is not verl's SFT or PPO module."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] not in ENTRIES:
        print(f"usage: python3 -m {__name__} {{{','.join(ENTRIES)}}} [hydra overrides...]", file=sys.stderr)
        return 2
    install()
    sys.argv = [args[0], *args[1:]]  # what hydra parses, as `python3 -m <entry> ...` would see it
    module = importlib.import_module(args[0])
    (run or (lambda m: m.main()))(module)
    return 0


if __name__ == "__main__":
    sys.exit(main())
