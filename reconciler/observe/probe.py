"""Ask every model Serve calls RUNNING for one real answer. I/O.

Serve's application status says that the replicas started and that their last health check
passed; it does not say that the engine behind them answers. A vLLM engine process that died
(killed, crashed in a kernel) leaves the replica RUNNING for up to three health-check periods,
and a replica whose engine is broken in a way ``check_health`` cannot see stays RUNNING for
good. So a model is RUNNING only once a real request through the OpenAI endpoint answered:
one token of a completion (or one embedding) per model, sent through the router exactly as a
client's request travels.

:class:`ModelProber` owns the only memo: one verdict per application, dropped when the
application is gone (bounded by the applications Serve runs). A verdict holds for the replica
set it was made for: a new replica (a redeploy, a scale-up, Serve replacing a dead one) needs a
new answer. A success is reused for ``fresh_for`` seconds (a burst of push ticks asks once), so in
effect every tick asks every RUNNING model once; a failure is asked again on every tick. No
answer in ``timeout`` (a busy model) is no verdict: the last one stands.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, replace
from typing import Any

from reconciler.builders.serve import app_name
from reconciler.plan.actual import ActualModel
from reconciler.redact import redact
from reconciler.spec.types import ObjectKey

log = logging.getLogger("argus")

# At most this much of an error answer is kept (the engine's exception is in its first lines).
MAX_ERROR_CHARS = 600
MAX_BODY_BYTES = 64 * 1024


@dataclass(frozen=True)
class Verdict:
    """What the last probe of one application found, for which replicas, when (monotonic s).

    ``ok``: True answered; False: the endpoint answered with a server error (``error`` says
    what); None: not answering yet (the router does not list it, a client error).
    """

    replicas: tuple[str, ...]
    at: float
    ok: bool | None
    error: str = ""


# (url, JSON body, timeout) -> (HTTP status or 0 when unreachable, body text); raises TimeoutError.
Poster = Callable[[str, Mapping[str, Any], float], tuple[int, str]]


def post_json(url: str, body: Mapping[str, Any], timeout: float, api_key: str | None = None) -> tuple[int, str]:
    """POST ``body`` as JSON (with ``Authorization: Bearer <api_key>`` when given); return
    ``(status, text)``, status 0 when nothing answered.

    Raises TimeoutError when the server accepted the request but did not answer in time.
    """
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
    req.add_header("Content-Type", "application/json")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return int(resp.status), resp.read(MAX_BODY_BYTES).decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read(MAX_BODY_BYTES).decode(errors="replace")
    except TimeoutError:
        raise
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise exc.reason from exc
        return 0, str(exc.reason)
    except OSError as exc:
        return 0, str(exc)


def probe_request(served_name: str, app: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The cheapest real request for the model an application serves: ``(path, body)``.

    Pure. A pooling model (``engine_kwargs.runner: pooling``) is asked for one embedding; every
    other model for one greedy token."""
    args = app.get("args") if isinstance(app.get("args"), Mapping) else {}
    llm = args.get("llm_config") if isinstance(args, Mapping) else None
    engine = llm.get("engine_kwargs") if isinstance(llm, Mapping) else None
    if isinstance(engine, Mapping) and engine.get("runner") == "pooling":
        return "/v1/embeddings", {"model": served_name, "input": "ping"}
    return "/v1/completions", {"model": served_name, "prompt": "ping", "max_tokens": 1, "temperature": 0}


def _error_text(status: int, text: str) -> str:
    """The engine's error from an error answer: the OpenAI error ``message`` when there is one."""
    message = text
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if isinstance(doc, Mapping):
        err = doc.get("error")
        if isinstance(err, Mapping) and isinstance(err.get("message"), str):
            message = err["message"]
        elif isinstance(err, str):
            message = err
    head = f"HTTP {status}" if status else "no connection"
    return redact(f"{head}: {' '.join(message.split())}"[:MAX_ERROR_CHARS])


class ModelProber:
    """Probe the models of one Serve endpoint; ``check`` returns the models with their verdicts.

    ``serve_url``: the Serve HTTP proxy (``http://host:port``), where the router answers. The
    requests run on ``workers`` threads of the prober's own; a tick waits at most ``wait``
    seconds for them, and a request still out after that is collected by a later tick (it is not
    sent again while it is out). So models that never answer (a hostile user's, a wedged one)
    cost each tick at most ``wait`` seconds, never ``timeout`` per model.
    """

    def __init__(
        self,
        serve_url: str,
        *,
        timeout: float = 10.0,
        wait: float = 2.0,
        fresh_for: float = 0.5,
        workers: int = 8,
        post: Poster = post_json,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.serve_url = serve_url.rstrip("/")
        self.timeout = timeout
        self.wait = wait
        self.fresh_for = fresh_for
        self._post = post
        self._clock = clock
        self._verdicts: dict[str, Verdict] = {}
        # Requests out now: name -> (replicas asked for, when sent, the answer to come).
        self._out: dict[str, tuple[tuple[str, ...], float, Future[tuple[bool | None, str] | None]]] = {}
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="argus-probe")

    def size(self) -> int:
        """How many verdicts and requests out are kept (one per model Serve runs, at most)."""
        return len(self._verdicts) + len(self._out)

    def close(self) -> None:
        """Stop taking requests; requests out finish in the background."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def check(
        self,
        models: Mapping[ObjectKey, ActualModel],
        apps: Mapping[str, Mapping[str, Any]],
        replica_ids: Mapping[str, tuple[str, ...]],
    ) -> dict[ObjectKey, ActualModel]:
        """Return ``models`` with ``awaiting_answer``/``answer_error`` set from a real request.

        Only models Serve calls RUNNING are asked; the others keep Serve's word. ``apps``: the
        deployed application configs by name; ``replica_ids``: running replicas by name. Never
        raises for one model's answer; waits at most ``wait`` seconds."""
        now = self._clock()
        wanted: dict[str, tuple[ObjectKey, ActualModel, tuple[str, ...]]] = {}
        for key, model in models.items():
            name = app_name(key.user, key.name)
            if model.status == "RUNNING":
                wanted[name] = (key, model, tuple(sorted(replica_ids.get(name, ()))))
        # The memo belongs to the applications that run: anything else is dropped here.
        self._verdicts = {n: v for n, v in self._verdicts.items() if n in wanted}
        for name in [n for n in self._out if n not in wanted]:
            self._out.pop(name)[2].cancel()
        for name, (_, model, replicas) in wanted.items():
            if name not in self._out and not self._fresh(self._verdicts.get(name), replicas, now):
                served, app = model.served_name, apps.get(name, {})
                self._out[name] = (replicas, now, self._pool.submit(self._probe, served, app))
        if self._out:
            futures_wait([f for _, _, f in self._out.values()], timeout=self.wait)
        for name, (asked, sent, future) in list(self._out.items()):
            if not future.done():
                continue
            del self._out[name]
            answer = None if future.cancelled() else future.result()
            replicas = wanted[name][2]
            if answer is None:  # no verdict (no answer in time, busy): the last one for these replicas stands
                last = self._verdicts.get(name)
                if last is None or last.replicas != replicas:
                    self._verdicts[name] = Verdict(replicas, sent, None, "no answer in time")
            elif asked == replicas:  # an answer about replicas that are gone says nothing about these
                self._verdicts[name] = Verdict(replicas, sent, answer[0], answer[1])
        out = dict(models)
        for name, (key, model, replicas) in wanted.items():
            verdict = self._verdicts.get(name)
            if verdict is None or verdict.replicas != replicas or verdict.ok is None:
                why = verdict.error if verdict and verdict.replicas == replicas else ""
                out[key] = replace(model, awaiting_answer=True, answer_error=why)
            elif verdict.ok is False:
                out[key] = replace(model, answer_error=verdict.error)
        return out

    def _fresh(self, verdict: Verdict | None, replicas: tuple[str, ...], now: float) -> bool:
        return (
            verdict is not None
            and verdict.ok is True
            and verdict.replicas == replicas
            and now - verdict.at < self.fresh_for
        )

    def _probe(self, served_name: str, app: Mapping[str, Any]) -> tuple[bool | None, str] | None:
        """``(ok, error)`` of one request; None when it timed out, Serve pushed back (busy) or the
        request could not be sent."""
        path, body = probe_request(served_name, app)
        try:
            status, text = self._post(self.serve_url + path, body, self.timeout)
        except TimeoutError:
            return None
        except Exception:  # argus's own failure to ask says nothing about the model: no verdict
            log.warning("probing %s failed", served_name, exc_info=True)
            return None
        if 200 <= status < 300:
            return True, ""
        if status in (429, 503):  # Serve's back-pressure: busy, which says nothing about the engine
            return None
        if status >= 500:
            return False, _error_text(status, text)
        # Not listed by the router yet (404), the proxy not up (0), a refused request: not an engine verdict.
        return None, _error_text(status, text)
