"""Tinker's futures: every call that does work answers ``{"request_id": ...}`` at once, and the SDK polls
``/api/v1/retrieve_future`` until the result is there.

The work runs on one thread, in the order the requests arrived (the SDK sends a training client's requests in
its own order, ``seq_id``), because the engine and the policy have one user at a time. A poll waits up to
``POLL_WAIT_S`` for its result before answering ``try_again`` (the SDK polls again at once, so a wait on the server
keeps it from spinning). A failure becomes ``{"error", "category"}``, which the SDK raises as
``RequestFailedError`` with that message: ``"user"`` for a request the service refuses, ``"server"`` otherwise.

Deliberate simplification: results are kept until the service closes (a script's results are small: per-token
arrays), and a result can be fetched more than once.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

from rlkit.tinker_api.convert import TinkerRequestError

POLL_WAIT_S = 20.0  # under the SDK's 45 s poll timeout
logger = logging.getLogger(__name__)


class FutureStore:
    """Runs submitted work on one thread, in order, and keeps each result by request id."""

    def __init__(self) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rlkit-tinker-worker")
        self._futures: dict[str, Future] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], Any], what: str) -> str:
        """Queue ``work`` (named ``what`` in failures) and return its request id."""
        with self._lock:
            request_id = f"req-{next(self._ids)}"
            self._futures[request_id] = self._executor.submit(self._run, work, what)
        return request_id

    def failed(self, message: str) -> str:
        """A request id whose result is the failure ``message`` (a route the service refuses as a future)."""
        future: Future = Future()
        future.set_result(failure(message, "user"))
        with self._lock:
            request_id = f"req-{next(self._ids)}"
            self._futures[request_id] = future
        return request_id

    @staticmethod
    def _run(work: Callable[[], Any], what: str) -> Any:
        try:
            return work()
        except TinkerRequestError as e:
            return failure(f"{what}: {e}", "user")
        except Exception as e:  # the SDK shows the message; the traceback stays in the service's log
            logger.exception("%s failed", what)
            return failure(f"{what} failed in rlkit: {type(e).__name__}: {e}", "server")

    def known(self, request_id: str) -> bool:
        return request_id in self._futures

    async def result(self, request_id: str, wait_s: float = POLL_WAIT_S) -> Any:
        """The result of ``request_id``, or :data:`TRY_AGAIN` if it is not done within ``wait_s``."""
        future = self._futures[request_id]
        try:
            return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), wait_s)
        except asyncio.TimeoutError:
            return TRY_AGAIN

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


class _TryAgain:
    def __repr__(self) -> str:
        return "TRY_AGAIN"


TRY_AGAIN = _TryAgain()


def failure(message: str, category: str) -> dict[str, str]:
    """The body of a failed future (``RequestFailedResponse``)."""
    return {"error": message, "category": category}
