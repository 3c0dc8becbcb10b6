"""A river_anyio client for the lifetime of a Starlette app (``river_anyio[starlette]``).

::

    river = river_lifespan("postgresql://...", queues={...}, workers=workers)
    # or river_lifespan("postgresql://...", river_anyio.Config(queues={...}, workers=workers))
    app = Starlette(routes=routes, lifespan=river)

    async def signup(request):
        run = request.state.river          # the ClientRun (also app.state.river)
        await run.client.insert(SendWelcome(to=...))

The client opens when the app starts (a start-up failure fails the app's start) and is
stopped gracefully, bounded by ``soft_stop_timeout``, when the server shuts the app down.
An existing lifespan is passed as ``lifespan=`` and runs inside the client's, so it can
use the client; its state is merged with ours.

A client that crashes (:class:`~river_anyio.ClientCrashedError`) is logged and raised out of
the lifespan, never swallowed. Servers that stop when a lifespan fails (Hypercorn's trio
worker) then exit with the error. Others only report a lifespan failure when they shut down
(Hypercorn's asyncio worker): give them :meth:`RiverLifespan.shutdown_trigger`, which raises
the crash into the server so that it stops instead of serving with a dead client::

    await hypercorn.asyncio.serve(app, config, shutdown_trigger=river.shutdown_trigger(stop.wait))

A readiness endpoint answers 200 with :meth:`ClientRun.health() <river_anyio.ClientRun.health>`
as JSON while the client is ok, and 503 with the reasons when it is not (or not running)::

    app = Starlette(routes=[health_route("/health"), ...], lifespan=river)
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Unpack

import anyio

from .._config import Config, ConfigOptions
from .._errors import ClientCrashedError, ConfigError
from .._runtime._entry import open_prepared, prepare
from .._runtime._supervisor import ClientRun
from ..drivers import Driver

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

__all__ = ["RiverLifespan", "health_endpoint", "health_response", "health_route", "river_lifespan"]

logger = logging.getLogger("river_anyio.client")

Lifespan = Callable[[Any], AbstractAsyncContextManager[Mapping[str, Any] | None]]


class RiverLifespan:
    """A Starlette ``lifespan``: runs the client while the app runs (see the module docs)."""

    def __init__(
        self,
        database: str | Driver,
        config: Config | None = None,
        *,
        lifespan: Lifespan | None = None,
        state_key: str = "river",
        **options: Unpack[ConfigOptions],
    ) -> None:
        # checked once, here: bad options fail when the app is built, not when it starts
        self._prepared = prepare(database, config, options)
        if lifespan is not None and not callable(lifespan):
            raise ConfigError("lifespan", "must be a lifespan callable: lifespan(app)", lifespan)
        if not isinstance(state_key, str) or not state_key.isidentifier():
            raise ConfigError("state_key", "must be a Python identifier", state_key)
        self._inner = lifespan
        self._key = state_key
        #: The running client while the app runs, else None.
        self.run: ClientRun | None = None
        #: The crash of the last run, if it crashed.
        self.crash: ClientCrashedError | None = None
        self._waiters: set[anyio.Event] = set()

    def __call__(self, app: Any) -> AbstractAsyncContextManager[dict[str, Any]]:
        return self._lifespan(app)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Any) -> AsyncIterator[dict[str, Any]]:
        if self.run is not None:
            raise RuntimeError("this RiverLifespan is already running an app")
        self.crash = None
        try:
            async with open_prepared(self._prepared) as run:
                self.run = run
                app_state = getattr(app, "state", None)
                if app_state is not None:
                    setattr(app_state, self._key, run)
                try:
                    if self._inner is None:
                        yield {self._key: run}
                    else:
                        async with self._inner(app) as inner:
                            yield {**(inner or {}), self._key: run}
                finally:
                    self.run = None
                    if app_state is not None:
                        with contextlib.suppress(AttributeError):
                            delattr(app_state, self._key)
        except ClientCrashedError as exc:
            logger.error(
                "river_anyio client crashed; ending the app's lifespan with the error: %s",
                exc,
                extra={"river_event": "client_crashed"},
            )
            self.crash = exc
            for event in self._waiters:
                event.set()
            raise

    def shutdown_trigger(
        self, trigger: Callable[[], Awaitable[object]] | None = None
    ) -> Callable[[], Awaitable[None]]:
        """A server ``shutdown_trigger`` (Hypercorn's ``serve``): returns when ``trigger``
        returns (never, without one), and raises :class:`~river_anyio.ClientCrashedError` as
        soon as the client crashes, so that the server stops with the error."""

        async def wait() -> None:
            event = anyio.Event()
            self._waiters.add(event)
            try:
                async with anyio.create_task_group() as tg:
                    if trigger is not None:

                        async def until_triggered() -> None:
                            await trigger()
                            tg.cancel_scope.cancel("shutdown triggered")

                        tg.start_soon(until_triggered)
                    if self.crash is None:
                        await event.wait()
                    tg.cancel_scope.cancel("river_anyio client crashed")
            finally:
                self._waiters.discard(event)
            if self.crash is not None:
                raise ClientCrashedError(str(self.crash)) from self.crash

        return wait


def river_lifespan(
    database: str | Driver,
    config: Config | None = None,
    *,
    lifespan: Lifespan | None = None,
    state_key: str = "river",
    **options: Unpack[ConfigOptions],
) -> RiverLifespan:
    """A Starlette lifespan running an ``open_client(database, config, **options)`` client
    while the app runs, as ``request.state.<state_key>`` and ``app.state.<state_key>``."""
    return RiverLifespan(database, config, lifespan=lifespan, state_key=state_key, **options)


# --- readiness -------------------------------------------------------------------------------

_NOT_RUNNING = {"ok": False, "reasons": ["the river_anyio client is not running"]}


def health_response(run: ClientRun | None) -> Response:
    """``run``'s health as JSON: 200 when ok, 503 when not or when ``run`` is None (the
    lifespan is not running). Never cached."""
    from starlette.responses import JSONResponse

    headers = {"Cache-Control": "no-store"}
    if run is None:
        return JSONResponse(_NOT_RUNNING, status_code=503, headers=headers)
    health = run.health()
    return JSONResponse(health.as_dict(), status_code=200 if health.ok else 503, headers=headers)


def _run_of(request: Request, state_key: str) -> ClientRun | None:
    run = getattr(request.state, state_key, None)
    if run is None:
        run = getattr(request.app.state, state_key, None)
    return run if isinstance(run, ClientRun) else None


async def health_endpoint(request: Request) -> Response:
    """A Starlette endpoint answering with the health of the client that
    :func:`river_lifespan` runs (``request.state.river``): 200 and the JSON of
    :meth:`Health.as_dict() <river_anyio.Health.as_dict>` when ok, 503 when not."""
    return health_response(_run_of(request, "river"))


def health_route(path: str = "/health", *, state_key: str = "river") -> Route:
    """A ``GET``/``HEAD`` route at ``path`` answering like :func:`health_endpoint`, for the
    client stored under ``state_key`` (``river_lifespan(..., state_key=...)``)."""
    from starlette.routing import Route

    if not isinstance(state_key, str) or not state_key.isidentifier():
        raise ConfigError("state_key", "must be a Python identifier", state_key)

    async def endpoint(request: Request) -> Response:
        return health_response(_run_of(request, state_key))

    return Route(path, endpoint, methods=["GET", "HEAD"], include_in_schema=False)
