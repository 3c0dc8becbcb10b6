"""Running the async client's code from a blocking caller, without an event loop.

The blocking client reuses the async :class:`river_anyio.Client` (validation, option
precedence, unique keys, middleware, insert notifications) over drivers whose I/O is blocking:
their ``async`` methods never suspend. Such a coroutine runs to its end on the first
``send(None)``; :func:`drive` does exactly that, and refuses a coroutine that does suspend
(an insert middleware or hook awaiting real async I/O cannot run in a blocking call).
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["drive"]

T = TypeVar("T")


def drive(coro: Coroutine[Any, Any, T]) -> T:
    """The result of ``coro``, run to its end in this thread; it must not suspend."""
    try:
        coro.send(None)
    except StopIteration as done:
        value: T = done.value
        return value
    coro.close()
    raise RuntimeError(
        "a blocking river_anyio call awaited something that waits for an event loop; insert "
        "middleware and hooks used with river_anyio.blocking must not await async I/O"
    )


def other_schema_error(schema: str | None) -> TypeError:
    """What a blocking driver's ``with_schema`` raises for a schema not its own: the blocking
    client's driver serves one schema."""
    return TypeError(
        "the blocking client's driver serves only its own schema; open another "
        f"river_anyio.blocking.Client with schema={schema!r}"
    )
