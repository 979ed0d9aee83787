"""Serve application builder for one argus model: ``import_path: reconciler.serve_apps.model_app:build_app``.

The application ``args`` are produced by ``reconciler.builders.serve.model_app_config``::

    {"argus": {"user": ..., "name": ..., "spec_hash": ..., "served_name": ...},
     "llm_config": {<keyword arguments of ray.serve.llm.LLMConfig>}}

``argus`` is metadata for the observer only; ``llm_config`` is passed to Ray Serve LLM as is.
"""

from __future__ import annotations

from typing import Any

from ray.serve.deployment import Application


def build_app(args: dict[str, Any]) -> Application:
    """Return the single ``LLMServer:<model_id>`` deployment for ``args["llm_config"]``.

    Raises KeyError when ``llm_config`` is missing and pydantic's ValidationError when it
    is not a valid LLMConfig (Serve then reports the application DEPLOY_FAILED with it).
    """
    from ray.serve.llm import LLMConfig, build_llm_deployment

    llm_config = LLMConfig(**args["llm_config"])
    return build_llm_deployment(llm_config)
