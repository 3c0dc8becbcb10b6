"""A TCP proxy between a client and PostgreSQL that can lose a statement's reply for real.

Armed, it forwards the next statement whose text contains ``marker`` to the server, reads the
server's whole answer (up to ``ReadyForQuery``: an autocommit statement has committed by then),
and closes both connections instead of forwarding it: the client sees its connection break
mid-statement after the server committed. Statement text is only on the wire when psycopg does
not use a prepared statement, so clients under test use ``prepare_threshold=None``.

:meth:`PgProxy.go_down` simulates the server going away without touching it: every open
connection is closed and new ones are closed as soon as they are accepted, until
:meth:`PgProxy.come_up`.

Server-to-client messages are framed (a type byte and a length) from the first one on, as long
as no SSL or GSS encryption is negotiated: :meth:`PgProxy.url` turns both off.
"""

from __future__ import annotations

import urllib.parse

import anyio
import anyio.abc
from anyio.abc import SocketStream, TaskStatus

__all__ = ["PgProxy"]

READY_FOR_QUERY = ord("Z")


class _Conn:
    __slots__ = ("triggered",)

    def __init__(self) -> None:
        #: the armed statement went to the server: its answer is to be dropped
        self.triggered = False


class PgProxy:
    """Listens on localhost; ``await tg.start(proxy.serve)`` returns the port."""

    def __init__(self, server_url: str, marker: bytes = b"") -> None:
        parts = urllib.parse.urlsplit(server_url)
        self._target = (parts.hostname or "127.0.0.1", parts.port or 5432)
        self._marker = marker
        self._arms = 0
        self.port = 0
        #: replies dropped so far, and set at the first
        self.drops = 0
        self.dropped = anyio.Event()
        self._down = False
        self._open: set[anyio.CancelScope] = set()
        #: connections refused while down
        self.refused = 0

    def go_down(self) -> None:
        """Close every connection, and refuse new ones until :meth:`come_up`."""
        self._down = True
        for scope in self._open:
            scope.cancel("the proxy went down")

    def come_up(self) -> None:
        self._down = False

    def arm(self, times: int = 1) -> None:
        """Drop the reply of the next ``times`` statements containing the marker."""
        self._arms += times

    def url(self, url: str) -> str:
        """``url`` pointed at this proxy, without SSL or GSS encryption."""
        parts = urllib.parse.urlsplit(url)
        netloc = parts.netloc.rpartition("@")
        userinfo = netloc[0] + "@" if netloc[1] else ""
        query = urllib.parse.parse_qsl(parts.query)
        query += [("sslmode", "disable"), ("gssencmode", "disable")]
        return urllib.parse.urlunsplit(
            (
                parts.scheme,
                f"{userinfo}127.0.0.1:{self.port}",
                parts.path,
                urllib.parse.urlencode(query),
                "",
            )
        )

    async def serve(self, *, task_status: TaskStatus[int] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1")
        async with listener, anyio.create_task_group() as tg:
            self.port = listener.extra(anyio.abc.SocketAttribute.local_port)
            task_status.started(self.port)
            await listener.serve(self._handle, tg)

    async def _handle(self, client: SocketStream) -> None:
        conn = _Conn()
        if self._down:
            self.refused += 1
            await client.aclose()
            return
        try:
            server = await anyio.connect_tcp(*self._target)
        except OSError:
            await client.aclose()
            return
        scope = anyio.CancelScope()
        self._open.add(scope)
        try:
            with scope:
                async with client, server, anyio.create_task_group() as tg:
                    tg.start_soon(self._to_server, client, server, conn, tg.cancel_scope)
                    tg.start_soon(self._to_client, server, client, conn, tg.cancel_scope)
        finally:
            self._open.discard(scope)

    async def _to_server(
        self,
        client: SocketStream,
        server: SocketStream,
        conn: _Conn,
        scope: anyio.CancelScope,
    ) -> None:
        marker = self._marker
        tail = b""
        try:
            async for chunk in client:
                if self._arms and not conn.triggered:
                    window = tail + chunk
                    if marker in window:
                        self._arms -= 1
                        conn.triggered = True  # before the server can answer
                    tail = window[-len(marker) :]
                else:
                    tail = b""
                await server.send(chunk)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        scope.cancel("client side closed")

    async def _to_client(
        self,
        server: SocketStream,
        client: SocketStream,
        conn: _Conn,
        scope: anyio.CancelScope,
    ) -> None:
        buf = b""
        try:
            async for chunk in server:
                buf += chunk
                out: list[bytes] = []
                while len(buf) >= 5:
                    end = 1 + int.from_bytes(buf[1:5], "big")
                    if len(buf) < end:
                        break
                    message, buf = buf[:end], buf[end:]
                    if not conn.triggered:
                        out.append(message)
                    elif message[0] == READY_FOR_QUERY:
                        # the statement is done (committed): lose the answer and the connection
                        self.drops += 1
                        self.dropped.set()
                        scope.cancel("reply dropped")
                        return
                if out:
                    await client.send(b"".join(out))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            pass
        scope.cancel("server side closed")
