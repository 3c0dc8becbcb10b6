"""Health from what the run already records, and the worker's tiny ``GET /health`` responder.

Each component that talks to the database keeps a :class:`Contact`: when its last round trip
succeeded (a time it already had in hand: producers take it from their pacer's claim, the
elector from the start of its attempt), and since when its round trips fail. :func:`health`
folds them into a :class:`~river_anyio.Health` when asked; nothing here runs on its own.

:class:`HealthServer` answers ``GET /health`` (and ``HEAD``) with the health as JSON, 200 when
ok and 503 when not, one request per connection: enough for an orchestrator's probe, with no
dependency (``river-anyio worker --health-port``).
"""

from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import anyio.abc
from anyio.abc import SocketStream, TaskStatus

from .._health import Health, QueueHealth
from .._timeutil import utc_now

if TYPE_CHECKING:
    from ._supervisor import ClientRun

__all__ = ["Contact", "HealthServer", "describe", "health"]

logger = logging.getLogger("river_anyio.client")

#: A probe's connection gets this long to send its request and read the answer.
REQUEST_TIMEOUT = 5.0
MAX_REQUEST = 8192


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class Contact:
    """One component's round trips with the database (times on the event loop's clock)."""

    __slots__ = ("error", "failing_since", "last_ok")

    def __init__(self) -> None:
        self.last_ok: float | None = None
        self.failing_since: float | None = None
        self.error: str | None = None

    def ok(self, at: float) -> None:
        """A round trip begun (or ended) at ``at`` succeeded."""
        self.last_ok = at
        self.failing_since = None

    def failed(self, exc: BaseException) -> None:
        if self.failing_since is None:
            self.failing_since = anyio.current_time()
        self.error = describe(exc)


def _wall(now: float, checked_at: dt.datetime, at: float | None) -> dt.datetime | None:
    if at is None:
        return None
    return checked_at - dt.timedelta(seconds=max(0.0, now - at))


def health(run: ClientRun) -> Health:
    """``run``'s health now (see :class:`~river_anyio.Health`)."""
    now = anyio.current_time()
    checked_at = utc_now()
    limits = run.config.health
    reasons: list[str] = []
    contacts = [run._start_contact]
    if run._completer is not None:
        contacts.append(run._completer.contact)
    if run._notifier is not None:
        contacts.append(run._notifier.contact)
    if run._elector is not None:
        contacts.append(run._elector.contact)

    queues: dict[str, QueueHealth] = {}
    queue_reasons: list[str] = []
    last_ok_times: list[float] = []
    failing_since: list[float] = []
    errors: list[str] = []
    for name, queue in run._queues.items():
        producer = queue.producer
        contact = producer.contact
        last_fetch = producer.last_claim_at
        failing = contact.failing_since
        if last_fetch is not None:
            last_ok_times.append(last_fetch)
        if failing is not None and now - failing >= limits.fetch_failing_after:
            queue_reasons.append(
                f"queue {name!r}: fetching jobs has failed for {now - failing:.1f}s"
                + (f" ({contact.error})" if contact.error else "")
            )
        queues[name] = QueueHealth(
            last_fetch_at=_wall(now, checked_at, last_fetch),
            last_fetch_age=None if last_fetch is None else max(0.0, now - last_fetch),
            failing_for=None if failing is None else max(0.0, now - failing),
            paused=producer.paused,
            active_jobs=producer.active_jobs,
        )
    for contact in contacts:
        if contact.last_ok is not None:
            last_ok_times.append(contact.last_ok)
    last_ok = max(last_ok_times) if last_ok_times else None
    # the database fails while failures began after its last success anywhere (a component
    # still failing since before then fails on its own: the database answered others since)
    for contact in [*contacts, *(q.producer.contact for q in run._queues.values())]:
        since = contact.failing_since
        if since is not None and (last_ok is None or since > last_ok):
            failing_since.append(since)
            if contact.error:
                errors.append(contact.error)
    failing_for = max(0.0, now - min(failing_since)) if failing_since else None
    error = errors[-1] if errors else None
    waiting = run._waiting_for_database
    if waiting:
        reasons.append(
            "waiting for the database"
            + (f" (unreachable for {failing_for:.1f}s: {error})" if failing_for else "")
        )
    if run.stopping:
        reasons.append("the client is stopping")
    unreachable = failing_for is not None and failing_for >= limits.database_failing_after
    if unreachable and not waiting:
        reasons.append(f"database unreachable for {failing_for:.1f}s: {error}")
    reasons.extend(queue_reasons)

    notifier = run._notifier
    connected: bool | None = None
    if notifier is not None:
        connected = notifier.connected_at is not None
        down = notifier.down_since
        threshold = limits.notifier_down_after
        if not connected and down is not None and threshold is not None and now - down >= threshold:
            reasons.append(f"the listener has been disconnected for {now - down:.1f}s")
    backlog = run._completer.statistics().pending if run._completer is not None else 0
    if backlog >= limits.completer_backlog_max:
        reasons.append(f"{backlog} finished jobs wait for their results to be written")

    reachable: bool | None = None
    if waiting or unreachable:
        reachable = False
    elif last_ok is not None or failing_for is not None:
        reachable = True
    return Health(
        ok=not reasons,
        reasons=tuple(reasons),
        checked_at=checked_at,
        database_reachable=reachable,
        database_last_ok_at=_wall(now, checked_at, last_ok),
        database_last_ok_age=None if last_ok is None else max(0.0, now - last_ok),
        database_failing_for=failing_for,
        database_error=error,
        waiting_for_database=waiting,
        notifier_connected=connected,
        queues=queues,
        completer_backlog=backlog,
        leader=run.is_leader,
        stopping=run.stopping,
    )


# --- GET /health ----------------------------------------------------------------------------

_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 503: "Service Unavailable"}


class HealthServer:
    """Answers ``GET /health`` on ``host:port`` with ``health()`` as JSON (200 ok, 503 not).
    Started with ``port = await tg.start(server.run)`` (the port bound, for port 0)."""

    def __init__(self, health: Callable[[], Health], *, host: str, port: int) -> None:
        self._health = health
        self._host = host
        self._port = port

    async def run(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host=self._host, local_port=self._port)
        async with listener, anyio.create_task_group() as tg:
            port = listener.extra(anyio.abc.SocketAttribute.local_port)
            logger.info(
                "health endpoint listening on http://%s:%d/health",
                self._host,
                port,
                extra={"river_event": "health_listening"},
            )
            task_status.started(port)
            await listener.serve(self._handle, tg)

    async def _handle(self, stream: SocketStream) -> None:
        # Never raises: a failure here must not end the client.
        try:
            with anyio.move_on_after(REQUEST_TIMEOUT):
                head = await _read_head(stream)
                if head is not None:
                    await stream.send(self._answer(head))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError):
            pass
        except Exception:
            logger.exception("health endpoint: answering a request failed")
        finally:
            with anyio.move_on_after(1, shield=True):
                await stream.aclose()

    def _answer(self, head: bytes) -> bytes:
        line = head.split(b"\r\n", 1)[0].decode("latin-1")
        parts = line.split(" ")
        method = parts[0] if parts else ""
        target = parts[1] if len(parts) > 1 else ""
        path = target.split("?", 1)[0]
        if path != "/health":
            return _response(404, b'{"error":"not found; try /health"}', head_only=False)
        if method not in ("GET", "HEAD"):
            return _response(405, b'{"error":"method not allowed"}', head_only=False)
        h = self._health()
        body = json.dumps(h.as_dict(), separators=(",", ":")).encode()
        return _response(200 if h.ok else 503, body, head_only=method == "HEAD")


async def _read_head(stream: SocketStream) -> bytes | None:
    """The request line and headers (a body, if any, is ignored); None if the peer sent
    nothing usable."""
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_REQUEST:
            return None
        try:
            data += await stream.receive()
        except anyio.EndOfStream:
            return None
    return data


def _response(status: int, body: bytes, *, head_only: bool) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Cache-Control: no-store\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    return head if head_only else head + body
