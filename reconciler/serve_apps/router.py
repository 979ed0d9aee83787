"""The one OpenAI-compatible router application: ``reconciler.serve_apps.router:build_router``.

It subclasses Ray Serve LLM's ``OpenAiIngress`` but starts with no models and discovers
them from ``serve.status()``: every application whose name starts with ``argus--`` and has
a running ``LLMServer`` replica is routable under the model id its ``llm_config()`` reports.
So the router's own config never changes as models come and go (changing it would restart
it and drop in-flight requests), and adding a model never touches another model's replica.

Each model is also routable under its stable alias: the ``served_name:`` of its file (carried
in ``llm_config.experimental_configs["argus_alias"]``) or else ``<user>-<name>``, derived from
the application name. The loader keeps aliases unique; should two running applications still
claim one (an INVALID file keeps its old application), the earlier-deployed one keeps it, and a
dated model id always wins over an alias. A request by alias reaches vLLM under the dated id
(vLLM only knows that one), so responses name the dated id.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from fastapi import status as http_status
from ray import serve
from ray.llm._internal.serve.core.configs.openai_api_models import OpenAIHTTPException, to_model_metadata
from ray.serve.deployment import Application
from ray.serve.handle import DeploymentHandle
from ray.serve.llm.ingress import OpenAiIngress, make_fastapi_ingress

logger = logging.getLogger("ray.serve")

OWNED_PREFIX = "argus--"
ROUTER_APP = "argus-router"
LLM_DEPLOYMENT_PREFIX = "LLMServer:"
REFRESH_INTERVAL_S = 2.0  # background refresh period
MISS_REFRESH_MIN_S = 0.5  # an unknown model triggers a refresh at most this often
LLM_CONFIG_TIMEOUT_S = 10.0  # bound on asking a new model's replica for its LLMConfig
ALIAS_KEY = "argus_alias"  # in LLMConfig.experimental_configs (reconciler/builders/serve.py)


class ModelNotFound(OpenAIHTTPException):
    """Unknown model id; Ray's error middleware reports the class name as the error type."""


class ArgusIngress(OpenAiIngress):
    """``OpenAiIngress`` whose model handles and cards follow the argus-owned Serve apps."""

    def __init__(self) -> None:
        super().__init__(llm_deployments={}, model_cards={})
        # app name -> (model id, deployment name, deployed at, alias card); cached until redeployed.
        self._apps: dict[str, tuple[str, str, float, Any]] = {}
        self._aliases: dict[str, str] = {}  # alias -> model id
        self._alias_cards: dict[str, Any] = {}  # alias -> ModelCard
        self._refused: set[str] = set()  # apps whose alias another app holds
        self._lock = asyncio.Lock()
        self._last_refresh = 0.0
        self._task: asyncio.Task[None] | None = None
        self._ensure_refresh_task()

    def _ensure_refresh_task(self) -> None:
        """Start the background refresh on the replica's event loop (once it runs)."""
        if self._task is not None and not self._task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # constructed outside the loop: check_health() starts it
        self._task = loop.create_task(self._refresh_loop())

    async def check_health(self) -> None:
        self._ensure_refresh_task()

    async def _refresh_loop(self) -> None:
        while True:
            try:
                await self._refresh()
            except Exception:  # keep serving the last known models; log and retry
                logger.exception("argus router: refreshing models failed")
            await asyncio.sleep(REFRESH_INTERVAL_S)

    async def _refresh(self) -> None:
        """Re-read Serve's status and update ``_default_serve_handles``/``_model_cards``."""
        async with self._lock:
            # serve.status() blocks on the controller: keep it off the event loop.
            serve_status = await asyncio.to_thread(serve.status)
            seen: set[str] = set()
            for app_name, app in serve_status.applications.items():
                if not app_name.startswith(OWNED_PREFIX):
                    continue
                deployment = _llm_deployment(app.deployments)
                if deployment is None:
                    continue
                states: dict[Any, int] = dict(app.deployments[deployment].replica_states)
                running = states.get("RUNNING", 0)  # keys are ReplicaState, a str enum
                if not running:
                    continue  # not routable yet (or any more); drop it below
                seen.add(app_name)
                cached = self._apps.get(app_name)
                if cached and cached[1] == deployment and cached[2] == app.last_deployed_time_s:
                    continue
                await self._add_model(app_name, deployment, app.last_deployed_time_s)
            for app_name in set(self._apps) - seen:
                self._remove(app_name)
            self._claim_aliases()
            self._last_refresh = time.monotonic()

    async def _add_model(self, app_name: str, deployment: str, deployed_at: float) -> None:
        handle: DeploymentHandle = serve.get_deployment_handle(deployment, app_name=app_name)
        # Bounded: a replica that does not answer must not stall the refresh (and requests).
        llm_config = await asyncio.wait_for(handle.llm_config.remote(), timeout=LLM_CONFIG_TIMEOUT_S)
        if llm_config is None:
            return
        model_id = llm_config.model_id
        old = self._apps.get(app_name)
        if old is not None and old[0] != model_id:
            self._remove(app_name)
        alias = _alias(app_name, llm_config)
        alias_card = to_model_metadata(alias, llm_config) if alias else None
        self._apps[app_name] = (model_id, deployment, deployed_at, alias_card)
        self._default_serve_handles[model_id] = handle
        self._configured_serve_handles.pop(model_id, None)  # rebuilt from the new handle
        self._model_cards[model_id] = to_model_metadata(model_id, llm_config)
        logger.info("argus router: serving %s from application %s", model_id, app_name)

    def _remove(self, app_name: str) -> None:
        model_id = self._apps.pop(app_name)[0]
        self._default_serve_handles.pop(model_id, None)
        self._configured_serve_handles.pop(model_id, None)
        self._model_cards.pop(model_id, None)
        logger.info("argus router: dropped %s (application %s)", model_id, app_name)

    def _claim_aliases(self) -> None:
        """Rebuild the alias table: earliest-deployed application first; dated ids win."""
        aliases: dict[str, str] = {}
        cards: dict[str, Any] = {}
        refused: set[str] = set()
        for app_name, (model_id, _, _, card) in sorted(self._apps.items(), key=lambda kv: (kv[1][2], kv[0])):
            if card is None:
                continue
            if card.id in self._model_cards or card.id in aliases:
                refused.add(app_name)
                if app_name not in self._refused:  # once, not every refresh
                    logger.warning("argus router: alias %s of %s is taken; not routed", card.id, app_name)
                continue
            aliases[card.id] = model_id
            cards[card.id] = card
        self._aliases, self._alias_cards, self._refused = aliases, cards, refused

    async def _resolve(self, model: str | None) -> str | None:
        """The dated model id ``model`` names (itself when it is one, or unknown)."""
        if model is None or model in self._model_cards:
            return model
        if model not in self._aliases and time.monotonic() - self._last_refresh > MISS_REFRESH_MIN_S:
            await self._refresh()  # it may have just become ready
        return self._aliases.get(model, model)

    async def _get_response(self, *, body: Any, call_method: str, raw_request: Any = None) -> Any:
        """Route a request by alias as if it named the dated id (vLLM serves only that name)."""
        target = await self._resolve(body.model)
        if target != body.model:
            body = body.model_copy(update={"model": target})
        async for response in super()._get_response(body=body, call_method=call_method, raw_request=raw_request):
            yield response

    async def model(self, model_id: str) -> Any:
        if model_id in self._alias_cards:
            return self._alias_cards[model_id]
        return await super().model(model_id)

    async def _get_model_id(self, model: str | None) -> str:
        """Refresh once on an unknown model (it may have just become ready), then 404."""
        if model is not None and model not in self._model_cards:
            if time.monotonic() - self._last_refresh > MISS_REFRESH_MIN_S:
                await self._refresh()
            if model not in self._model_cards:
                raise ModelNotFound(
                    status_code=http_status.HTTP_404_NOT_FOUND,
                    message=f"The model `{model}` does not exist or is not ready.",
                    type="ModelNotFound",
                )
        return await super()._get_model_id(model)

    async def models(self) -> Any:
        """Every dated model id, then every alias (``/v1/models``)."""
        if time.monotonic() - self._last_refresh > MISS_REFRESH_MIN_S:
            await self._refresh()
        listing = await super().models()
        listing.data.extend(self._alias_cards.values())
        return listing


def _llm_deployment(deployments: dict[str, Any]) -> str | None:
    """The ``LLMServer:*`` deployment of an application, or its only deployment."""
    for name in deployments:
        if name.startswith(LLM_DEPLOYMENT_PREFIX):
            return name
    return next(iter(deployments)) if len(deployments) == 1 else None


def _alias(app_name: str, llm_config: Any) -> str | None:
    """The alias the model file set (``served_name:``), else ``<user>-<name>`` of the app name."""
    parts = app_name[len(OWNED_PREFIX) :].split("--")
    if len(parts) != 2 or not all(parts):
        return None
    extra = getattr(llm_config, "experimental_configs", None) or {}
    alias = extra.get(ALIAS_KEY) if isinstance(extra, dict) else None
    if isinstance(alias, str) and alias:
        # Only in the app's own user's namespace: an application PUT by code on the cluster under
        # alice's app name can never take bob's alias (the loader's rule, enforced here again).
        return alias if alias.startswith(f"{parts[0]}-") else None
    return f"{parts[0]}-{parts[1]}"


def build_router(args: dict[str, Any] | None = None) -> Application:
    """Return the router application. ``args`` is unused (kept empty so the config never changes)."""
    ingress_cls = make_fastapi_ingress(ArgusIngress)
    # The replica count is not set here: the application config's `deployments` override
    # carries an autoscaling_config (min 2 by default), which Serve changes in place.
    # No CPU reservation: a router replica only forwards requests; its CPU would otherwise
    # be missing from the capacity argus plans models against.
    return serve.deployment(
        ingress_cls,
        name="ArgusRouter",
        max_ongoing_requests=1000,
        ray_actor_options={"num_cpus": 0},
    ).bind()  # type: ignore[attr-defined]
