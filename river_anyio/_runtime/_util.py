"""Small runtime helpers: back-off with jitter, a re-armable wake-up, cancel reasons."""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
from collections.abc import Callable, Mapping

import anyio

__all__ = ["Backoff", "Wakeup", "leaves", "loop_clock"]

STOP_TIMEOUT_REASON = "soft stop timeout"
STOP_AND_CANCEL_REASON = "stop and cancel"
REMOTE_CANCEL_REASON = "job cancelled remotely"


class Backoff:
    """Exponential back-off for operational database faults: 250 ms doubling to 30 s, ±10%,
    reset after a success."""

    def __init__(self, first: float = 0.25, cap: float = 30.0, jitter: float = 0.1) -> None:
        self._first = first
        self._cap = cap
        self._jitter = jitter
        self._attempt = 0

    def next_delay(self) -> float:
        base = min(self._cap, self._first * float(2**self._attempt))
        self._attempt += 1
        return base * (1 + random.uniform(-self._jitter, self._jitter))

    def reset(self) -> None:
        self._attempt = 0

    @property
    def failures(self) -> int:
        return self._attempt


class Wakeup:
    """A level-triggered wake-up: ``set()`` from anywhere, ``wait()`` consumes it."""

    def __init__(self) -> None:
        self._event = anyio.Event()
        self._set = False

    def set(self) -> None:
        if not self._set:
            self._set = True
            self._event.set()

    def is_set(self) -> bool:
        return self._set

    async def wait(self) -> None:
        if not self._set:
            await self._event.wait()
        self.clear()

    def clear(self) -> None:
        if self._set:
            self._set = False
            self._event = anyio.Event()


def loop_clock() -> Callable[[], float]:
    """``anyio.current_time`` of the running event loop, without its backend lookup on each
    call (a noticeable share of a short job's cost on asyncio). Call it inside the loop."""
    exc = anyio.get_cancelled_exc_class()
    if exc is asyncio.CancelledError:
        return asyncio.get_running_loop().time  # what AnyIO's asyncio backend reads
    if exc.__module__.startswith("trio"):
        import trio

        return trio.current_time
    return anyio.current_time


def leaves(exc: BaseException) -> list[BaseException]:
    """Every exception in ``exc``, exception groups flattened."""
    if isinstance(exc, BaseExceptionGroup):
        out: list[BaseException] = []
        for e in exc.exceptions:
            out.extend(leaves(e))
        return out
    return [exc]


async def call_hook(
    fn: Callable[..., object],
    *args: object,
    logger: logging.Logger,
    what: str,
    extra: Mapping[str, object] | None = None,
) -> None:
    """Call an observing hook (sync or async) with ``args``: one that raises is logged as
    ``"<what> raised; ignored"`` and the caller goes on, as for every hook river_anyio calls."""
    try:
        result = fn(*args)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("%s raised; ignored", what, extra=extra)
