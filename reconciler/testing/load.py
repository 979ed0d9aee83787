"""A client that keeps sending requests to one model while something else changes (tests, bench)."""

from __future__ import annotations

import threading
import time
from typing import Any


class RequestLooper:
    """Sends tiny completions to ``model_id`` in a thread until the ``with`` block ends.

    ``ok`` counts answers, ``failures`` holds the repr of every failed request: with
    ``max_retries=0`` on the client, a failure is a failure, not a hidden retry.
    """

    def __init__(self, client: Any, model_id: str, pause_after_failure: float = 0.05) -> None:
        self.client, self.model_id = client, model_id
        self.pause_after_failure = pause_after_failure  # a refused connection fails fast: do not spin
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.client.completions.create(model=self.model_id, prompt="hi", max_tokens=2, temperature=0)
                self.ok += 1
            except Exception as exc:  # every kind of failure counts
                self.failures.append(repr(exc))
                time.sleep(self.pause_after_failure)

    def __enter__(self) -> RequestLooper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=90)
