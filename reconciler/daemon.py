"""The composition root: builds a tick's parts (:func:`build_parts`) for the loop and the CLI.

The tick lives in :mod:`reconciler.tick`, the loop in :mod:`reconciler.loop`, the report (status,
log lines, metrics) in :mod:`reconciler.report`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from functools import partial

from reconciler.apply.applier import Applier, RecordRuns
from reconciler.apply.ownership import load_or_create_key
from reconciler.dashboard import Clusters, Dashboard
from reconciler.endpoint.hub import EndpointHub
from reconciler.fscache import CachedFS
from reconciler.loop import Daemon
from reconciler.observe.api_keys import KeysFiles, split_paths
from reconciler.observe.observer import Observer, serve_url_beside
from reconciler.report import Reporter
from reconciler.source.localfs import LocalFS
from reconciler.source.remote import RepoSource
from reconciler.source.revision import RevisionReader
from reconciler.source.signatures import SigningPolicy
from reconciler.spec.loader import ModelCheck, TaskCheck
from reconciler.spec.paths import FileSystem
from reconciler.spec.types import ClusterSpec
from reconciler.status.trust import trusted_documents
from reconciler.tick import SECRET_ENV_NAMES, STATUS_BRANCH, Parts, StatusDocs, TickResult

__all__ = ["SECRET_ENV_NAMES", "Daemon", "Parts", "Reporter", "TickResult", "build_parts", "default_task_check"]


def default_state_dir() -> str:
    """The daemon's state folder (``<argus --cache-dir>/state``): where the ownership key lives."""
    return os.path.join(os.environ.get("ARGUS_CACHE_DIR") or os.path.expanduser("~/.cache/argus"), "state")


def default_task_check() -> TaskCheck | None:
    """verl's override check when verl is installed."""
    try:
        from reconciler.checks.verl_overrides import check_overrides, verl_available
    except ImportError:
        return None
    return check_overrides if verl_available() else None


def default_model_check() -> ModelCheck | None:
    """vLLM's engine-argument check when vLLM is installed: the installed vLLM's table when it is the version
    ``serving.accelerator``'s image runs (read in a child process), else the one shipped for it. Returns None
    without vLLM."""
    from reconciler.checks.engine_args import check_engine_kwargs, vllm_available

    return check_engine_kwargs if vllm_available() else None


def secrets_from_environment() -> dict[str, str]:
    """The secrets jobs get: SECRET_ENV_NAMES as the daemon's environment sets them (empty = unset)."""
    return {k: os.environ[k] for k in SECRET_ENV_NAMES if os.environ.get(k, "").strip()}


def build_parts(
    source: RepoSource,
    branch: str,
    dash: Dashboard,
    *,
    fs: FileSystem | None = None,
    secrets_env: Mapping[str, str] | None = None,
    task_check: TaskCheck | None = None,
    model_check: ModelCheck | None = None,
    signing: SigningPolicy | None = None,
    state_dir: str | None = None,
    ownership_key: bytes | None = None,
    status_docs: StatusDocs | None = None,
    record_runs: RecordRuns | None = None,
    serve_url: str | None = None,
    api_keys: str | Sequence[str] | None = None,
    endpoint_listen: str | None = None,
    endpoint_link: str | None = None,
    serving_dashboard: Callable[[str, str | None], Dashboard] | None = None,
) -> Parts:
    """The parts that reconcile ``branch`` of ``source`` with the Ray cluster behind ``dash``.

    ``fs``: the file system the loader checks paths on (default: the local one, its answers kept and
    checked again on each timer tick, see :mod:`reconciler.fscache`); ``secrets_env`` (default:
    :func:`secrets_from_environment`); ``task_check``/``model_check`` (default: verl's and vLLM's
    when installed); ``ownership_key`` signs and proves argus's jobs (default:
    ``load_or_create_key`` in ``state_dir`` or :func:`default_state_dir`); ``status_docs`` returns
    the status branch's documents (default: read the branch; the daemon gives its status writer's);
    ``record_runs``: see :class:`~reconciler.tick.Parts`; ``serve_url``: Serve's own proxy, where models are
    asked for a real answer before they count as RUNNING and the endpoint forwards ("": the dashboard's
    host at ``serving.internal_http_port``;
    None: Serve's status alone); ``api_keys``: the API keys files the endpoint checks callers against, the
    admin's and the git server's self-service one (:mod:`reconciler.observe.api_keys`; none: the OpenAI
    endpoint is open); ``endpoint_listen``: where this process serves the OpenAI endpoint (``auto``:
    cluster.yaml's ``serving.http_port``; ``HOST:PORT``; None: not here) and ``endpoint_link``: the Unix
    socket ``argus endpoint`` processes are served on (None: none); with neither, no endpoint (one tick);
    ``serving_dashboard`` makes the dashboard of cluster.yaml's ``serving.ray_address`` from its
    address and token (default: :class:`~reconciler.dashboard.Dashboard`; tests give a stand-in).

    Raises ValueError for a malformed ``endpoint_listen``."""
    key_files = split_paths(api_keys)
    key = ownership_key if ownership_key is not None else load_or_create_key(state_dir or default_state_dir())
    revisions = RevisionReader(
        source,
        branch,
        fs=fs if fs is not None else CachedFS(LocalFS()),
        task_check=task_check if task_check is not None else default_task_check(),
        model_check=model_check if model_check is not None else default_model_check(),
        signing=signing,
        state_dir=state_dir,
    )
    secrets = dict(secrets_env) if secrets_env is not None else secrets_from_environment()
    # Tasks on ``dash``; models on cluster.yaml's serving.ray_address when it names one.
    clusters = Clusters(dash, make=serving_dashboard)
    hub = None
    if endpoint_listen is not None or endpoint_link is not None:
        hub = EndpointHub(partial(serve_proxy_url, clusters, serve_url), listen=endpoint_listen, link=endpoint_link)
    return Parts(
        branch=branch,
        revisions=revisions,
        observer=Observer(dash, key, serve_url, clusters=clusters),
        applier=Applier(
            dash,
            secrets_env=secrets,
            ownership_key=key,
            api_keys=KeysFiles(key_files).read if key_files else None,
            gate=hub.publish if hub is not None else None,
            clusters=clusters,
        ),
        status_docs=status_docs or partial(trusted_documents, source.repo.path, STATUS_BRANCH, key),
        record_runs=record_runs,
        state_dir=state_dir,
        endpoint=hub,
    )


def serve_proxy_url(clusters: Clusters, serve_url: str | None, cluster: ClusterSpec) -> str:
    """Ray Serve's own proxy, where the endpoint forwards and the prober asks: ``serve_url`` when
    one is given, else the serving cluster's dashboard host at ``serving.internal_http_port``."""
    dash = clusters.serving(cluster.serving.ray_address)
    return (serve_url or serve_url_beside(dash.base_url, cluster.serving.internal_http_port)).rstrip("/")
