"""argus: a GitOps reconciler for Ray clusters (Ray Jobs for training, Ray Serve LLM for models)."""

from reconciler import git

__version__ = "0.2.0"

# Before any git command: every one of them inherits this process's environment (reconciler/git.py).
git.apply()
