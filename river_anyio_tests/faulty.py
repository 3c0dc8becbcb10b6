"""A fault-injecting driver for tests: a real driver behind the driver protocol, with chosen
operations made to fail, wait, or lose their reply.

``FaultyDriver(driver)`` implements :class:`~river_anyio.drivers.Driver` around a real
PostgreSQL or SQLite driver, so ``open_client(faulty, ...)`` runs the whole client through it.
Every executor it hands out (``executor()``, ``transaction()``, ``executor_for()``) and its
listener pass each call through the faults registered for that operation:

- ``fail(op, error)``: raise ``error`` instead of running the operation (by default a
  transient :class:`~river_anyio.ConnectionLostError`; pass a ``DatabaseError`` for a
  permanent one, or any exception for an "impossible" bug);
- ``drop_reply(op)``: run the operation for real (it commits), then raise as if the
  connection broke before the reply arrived; the lost replies are kept in ``fault.replies``;
- ``delay(op, seconds, until=event)``: wait (a time, and/or until an event is set), then run;
- ``delay_reply(op, seconds, until=event)``: run the operation for real (it commits), then
  wait before its reply reaches the caller.

Operations are named by the executor's method names (``job_get_available``...), plus
``transaction`` (entering a transaction), ``listener`` (opening the listener),
``listener_close`` (after it closed), ``listen``, ``unlisten``, ``ping`` and ``notification``
(each notification received, the call's one argument). Each fault lets ``skip`` matching
calls through, then applies to ``times`` calls (None: all), optionally only to calls
``where(call)`` accepts; ``hits`` counts them and ``hit`` is set at the first (for
``drop_reply`` and ``delay_reply``, once the operation is done; for ``delay``, while the call
waits). ``calls`` counts every operation called. Executor methods are forwarded by name, so
operations added to the protocol are covered without changes here.
"""

from __future__ import annotations

import collections
import contextlib
import inspect
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal, cast

import anyio
import attrs

import river_anyio as river
from river_anyio.drivers import Driver, Executor, Listener, Notification, open_driver

__all__ = ["Call", "Fault", "FaultyDriver", "open_faulty"]

Action = Literal["fail", "drop_reply", "delay", "delay_reply"]


def connection_lost() -> BaseException:
    """The default injected error: transient, like a dropped connection."""
    return river.ConnectionLostError("injected fault: the connection was lost")


@attrs.frozen
class Call:
    """One call of an operation, as a ``where`` predicate sees it."""

    operation: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@attrs.define(eq=False, kw_only=True)
class Fault:
    """One registered fault (see the module docstring)."""

    operation: str
    action: Action
    error: BaseException | Callable[[], BaseException] = connection_lost
    seconds: float = 0.0
    until: anyio.Event | None = None
    skip: int = 0
    times: int | None = 1
    where: Callable[[Call], bool] | None = None
    #: matching calls seen, and those the fault applied to
    seen: int = 0
    hits: int = 0
    hit: anyio.Event = attrs.field(factory=anyio.Event)
    #: what ``drop_reply`` calls returned (and the caller never got)
    replies: list[Any] = attrs.field(factory=list)

    def _take(self, call: Call) -> bool:
        if call.operation != self.operation or (self.where is not None and not self.where(call)):
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.hits >= self.times):
            return False
        self.hits += 1
        return True

    def _error(self) -> BaseException:
        err = self.error
        return err if isinstance(err, BaseException) else err()


class FaultyDriver:
    """A :class:`~river_anyio.drivers.Driver` around ``inner`` that injects faults."""

    def __init__(self, inner: Driver) -> None:
        self.inner = inner
        self.faults: list[Fault] = []
        self.calls: collections.Counter[str] = collections.Counter()
        #: Every notification loop its listeners handed out.
        self.loops: list[FaultyNotifications] = []

    # --- registering faults ---------------------------------------------------------------------

    def fail(
        self,
        operation: str,
        error: BaseException | Callable[[], BaseException] = connection_lost,
        **when: Any,
    ) -> Fault:
        return self._add(Fault(operation=operation, action="fail", error=error, **when))

    def drop_reply(
        self,
        operation: str,
        error: BaseException | Callable[[], BaseException] = connection_lost,
        **when: Any,
    ) -> Fault:
        return self._add(Fault(operation=operation, action="drop_reply", error=error, **when))

    def delay(
        self,
        operation: str,
        seconds: float = 0.0,
        *,
        until: anyio.Event | None = None,
        **when: Any,
    ) -> Fault:
        return self._add(
            Fault(operation=operation, action="delay", seconds=seconds, until=until, **when)
        )

    def delay_reply(
        self,
        operation: str,
        seconds: float = 0.0,
        *,
        until: anyio.Event | None = None,
        **when: Any,
    ) -> Fault:
        return self._add(
            Fault(operation=operation, action="delay_reply", seconds=seconds, until=until, **when)
        )

    def clear(self) -> None:
        """Remove every fault (calls go straight through again)."""
        self.faults.clear()

    def _add(self, fault: Fault) -> Fault:
        self.faults.append(fault)
        return fault

    def _fault_for(self, call: Call) -> Fault | None:
        self.calls[call.operation] += 1
        for fault in self.faults:
            if fault._take(call):
                return fault
        return None

    async def _call(self, operation: str, fn: Callable[..., Any], *args: Any, **kw: Any) -> Any:
        fault = self._fault_for(Call(operation, args, kw))
        if fault is None:
            return await fn(*args, **kw)
        if fault.action == "fail":
            fault.hit.set()
            raise fault._error()
        if fault.action == "delay":
            fault.hit.set()  # set while the call waits
            if fault.seconds:
                await anyio.sleep(fault.seconds)
            if fault.until is not None:
                await fault.until.wait()
            return await fn(*args, **kw)
        reply = await fn(*args, **kw)
        fault.replies.append(reply)
        fault.hit.set()  # the operation is done, its reply about to be lost or delayed
        if fault.action == "delay_reply":
            if fault.seconds:
                await anyio.sleep(fault.seconds)
            if fault.until is not None:
                await fault.until.wait()
            return reply
        raise fault._error()

    async def _check(self, operation: str) -> None:
        """A fault point without an operation of its own to run (opening, closing...)."""

        async def nothing() -> None:
            return None

        await self._call(operation, nothing)

    # --- the Driver protocol ---------------------------------------------------------------------

    @property
    def dialect(self) -> Any:
        return self.inner.dialect

    @property
    def schema(self) -> str | None:
        return self.inner.schema

    @property
    def supports_listen_notify(self) -> bool:
        return self.inner.supports_listen_notify

    def executor(self) -> Executor:
        return self._wrap(self.inner.executor())

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Executor]:
        await self._check("transaction")
        async with self.inner.transaction() as tx:
            yield self._wrap(tx)

    def executor_for(self, conn: object) -> Executor:
        if isinstance(conn, FaultyExecutor):
            return cast(Executor, conn)
        return self._wrap(self.inner.executor_for(conn))

    @contextlib.asynccontextmanager
    async def listener(self) -> AsyncIterator[Listener]:
        await self._check("listener")
        try:
            async with self.inner.listener() as inner:
                yield cast(Listener, FaultyListener(inner, self))
        finally:  # however it closes (a fault here is a failure during cleanup)
            await self._check("listener_close")

    async def aclose(self) -> None:
        await self.inner.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _wrap(self, executor: Executor) -> Executor:
        return cast(Executor, FaultyExecutor(executor, self))


class FaultyExecutor:
    """An executor whose every async method goes through the driver's faults."""

    def __init__(self, inner: Executor, driver: FaultyDriver) -> None:
        self.inner = inner
        self._faulty = driver

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name.startswith("_") or not inspect.iscoroutinefunction(attr):
            return attr
        faulty = self._faulty

        async def call(*args: Any, **kw: Any) -> Any:
            return await faulty._call(name, attr, *args, **kw)

        return call


class FaultyListener:
    """A listener whose calls and received notifications go through the driver's faults."""

    def __init__(self, inner: Listener, driver: FaultyDriver) -> None:
        self.inner = inner
        self._faulty = driver

    async def listen(self, topic: str) -> None:
        await self._faulty._call("listen", self.inner.listen, topic)

    async def unlisten(self, topic: str) -> None:
        await self._faulty._call("unlisten", self.inner.unlisten, topic)

    def __aiter__(self) -> AsyncIterator[Notification]:
        loop = FaultyNotifications(self.inner, self._faulty)
        self._faulty.loops.append(loop)
        return loop

    def __getattr__(self, name: str) -> Any:  # ``ping`` on PostgreSQL
        attr = getattr(self.inner, name)
        if name.startswith("_") or not inspect.iscoroutinefunction(attr):
            return attr
        faulty = self._faulty

        async def call(*args: Any, **kw: Any) -> Any:
            return await faulty._call(name, attr, *args, **kw)

        return call


class FaultyNotifications:
    """One loop's notifications, each through the driver's faults; closed with ``aclose`` as
    an async generator is, so a test can tell whether its consumer closed it."""

    def __init__(self, inner: Listener, driver: FaultyDriver) -> None:
        self._inner = aiter(inner)
        self._faulty = driver
        self.closed = False

    def __aiter__(self) -> FaultyNotifications:
        return self

    async def __anext__(self) -> Notification:
        if self.closed:
            raise StopAsyncIteration
        note = await anext(self._inner)

        async def receive(note: Notification) -> Notification:
            return note

        result: Notification = await self._faulty._call("notification", receive, note)
        return result

    async def aclose(self) -> None:
        self.closed = True


@contextlib.asynccontextmanager
async def open_faulty(url: str, **options: Any) -> AsyncIterator[FaultyDriver]:
    """A real driver opened from ``url`` (``options`` as ``open_driver``'s), wrapped."""
    async with open_driver(url, **options) as driver:
        yield FaultyDriver(driver)
