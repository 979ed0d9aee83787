"""What keeps a job from running code it finds in its ``HOME``. Pure: no I/O.

Every job's ``HOME`` is its user's folder (``<paths.users>/<user>``), the folder the file service writes
uploads into. Python and the libraries a training job runs load code and config-as-code from ``HOME``
by themselves, at start-up or on first use, so an upload alone (a ``.pth`` file, a kernel cache, an rc
file) would run in the user's verl jobs, which run nothing else of hers unless her task file says so.
:func:`isolation_env` turns those loads off or points them elsewhere; ``docs/security.md`` lists them.
"""

from __future__ import annotations

import posixpath

from reconciler.spec.types import TaskSpec

# Where a job's libraries keep what they would otherwise keep under $HOME and load back as code: a folder per
# user on the node, outside the file service's reach (the user's folder is where uploads land).
JOB_CACHE_ROOT = "/tmp/argus-cache"
# Python's user site-packages ($HOME/.local/lib/pythonX.Y/site-packages): its *.pth lines run at every Python
# start-up and its usercustomize is imported then, in every process of the job, Ray's workers included.
ENV_NO_USER_SITE = "PYTHONNOUSERSITE"


def isolation_env(task: TaskSpec) -> dict[str, str]:
    """The environment that keeps a job from loading code from its ``HOME`` (the user's upload folder)
    without being asked to: Python's user site-packages is off (``PYTHONNOUSERSITE=1``, unless the task
    says ``user_site: true``), and what verl, Ray, torch, triton, vLLM, flashinfer, CUDA, wandb, matplotlib
    and git keep under ``$HOME`` and load back (compiled kernels and their launchers, compile caches,
    torch hub and extension builds, Hugging Face's module cache when ``HF_HOME`` is not set, rc and config
    files) lives under ``JOB_CACHE_ROOT/<user>`` on the node instead. cluster.yaml's ``env`` and the task's
    own ``env`` come after it (:func:`job_env`): an explicit setting wins, and ``argus render`` shows it."""
    scratch = posixpath.join(JOB_CACHE_ROOT, task.key.user)
    env = {
        # torch hub and extensions, vLLM's compile cache, Hugging Face (without HF_HOME), pip, outlines...
        "XDG_CACHE_HOME": posixpath.join(scratch, "cache"),
        # matplotlibrc (its backend may name a module), vLLM's, git's config/git/config...
        "XDG_CONFIG_HOME": posixpath.join(scratch, "config"),
        "MPLCONFIGDIR": posixpath.join(scratch, "config", "matplotlib"),
        # triton's kernel cache holds the compiled launcher it loads as a Python extension module
        "TRITON_HOME": scratch,
        "TRITON_CACHE_DIR": posixpath.join(scratch, ".triton", "cache"),
        "FLASHINFER_WORKSPACE_BASE": scratch,  # flashinfer's JIT-built kernels (.so), under $HOME otherwise
        "CUDA_CACHE_PATH": posixpath.join(scratch, ".nv", "ComputeCache"),
        "CUPY_CACHE_DIR": posixpath.join(scratch, ".cupy", "kernel_cache"),
        # wandb reads its settings (base_url: where the cluster's WANDB_API_KEY is sent) from here
        "WANDB_CONFIG_DIR": posixpath.join(scratch, "config", "wandb"),
        # ~/.gitconfig runs programs (core.fsmonitor, credential helpers) wherever git runs, wandb's included
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }
    if not task.user_site:
        env[ENV_NO_USER_SITE] = "1"
    return env
