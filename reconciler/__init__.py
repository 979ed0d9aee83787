"""argus: a GitOps reconciler for Ray clusters (Ray Jobs for training, Ray Serve LLM for models)."""

__version__ = "0.1.0"
