"""What the server behind a PostgreSQL driver can do: detected once, when the driver opens.

River 0.51 runs on YugabyteDB, which speaks PostgreSQL's protocol but lacks two things River
otherwise relies on:

- LISTEN/NOTIFY, unless the server is 2025.2.3 or later with ``yb_enable_listen_notify`` on:
  without it a client sends no notifications, and learns of new jobs, queue changes and
  cancellations of its running jobs by polling;
- the ``xmax`` system column, by which an upsert tells an inserted row from an existing one:
  unique inserts instead write a random nonce into the job's metadata
  (``river:unique_nonce``), and a row returned without this insert's nonce is the existing
  duplicate.

The server is recognised as River Go recognises it: ``version()`` naming Yugabyte (``-YB``),
and the ``yb_enable_listen_notify`` setting. Both are read through the session's
``search_path``, as River reads them.
"""

from __future__ import annotations

from typing import Any, Final

import attrs
import psycopg
from psycopg.rows import tuple_row

__all__ = ["POSTGRES", "ServerCapabilities", "detect_capabilities", "detect_capabilities_sync"]

#: The detection query (unqualified names: the session's ``search_path`` resolves them).
DETECT: Final = (
    "SELECT version()::text, current_setting('server_version_num')::integer, "
    "coalesce(current_setting('yb_enable_listen_notify', true), 'off')::boolean"
)


@attrs.frozen(kw_only=True)
class ServerCapabilities:
    """The PostgreSQL-compatible server a driver talks to, and what follows for River.

    ``product`` is ``version()``'s text and ``version_num`` ``server_version_num``.
    ``yugabyte``: the server is YugabyteDB. ``listen_notify``: notifications can be sent and
    received (always on PostgreSQL; on YugabyteDB only with ``yb_enable_listen_notify``).
    ``unique_nonce``: unique inserts are told apart by a metadata nonce rather than
    ``xmax`` (YugabyteDB).
    """

    product: str
    version_num: int
    yugabyte: bool
    listen_notify: bool

    @property
    def unique_nonce(self) -> bool:
        return self.yugabyte

    @classmethod
    def from_server(
        cls, product: str, version_num: int, yb_listen_notify: bool
    ) -> ServerCapabilities:
        """River's reading of the detection query's values."""
        lowered = product.lower()
        yugabyte = "-yb" in lowered or "yugabyte" in lowered
        return cls(
            product=product,
            version_num=version_num,
            yugabyte=yugabyte,
            listen_notify=not yugabyte or yb_listen_notify,
        )


#: A plain PostgreSQL server: what a driver assumes when it was not detected.
POSTGRES: Final = ServerCapabilities(
    product="PostgreSQL", version_num=0, yugabyte=False, listen_notify=True
)


async def detect_capabilities(conn: psycopg.AsyncConnection[Any]) -> ServerCapabilities:
    """Run the detection query on ``conn`` (psycopg errors propagate)."""
    cur = await conn.execute(DETECT, prepare=False)
    return _read(await cur.fetchone())


def detect_capabilities_sync(conn: psycopg.Connection[Any]) -> ServerCapabilities:
    """:func:`detect_capabilities` on a blocking connection, perhaps a caller's (a plain
    cursor: the connection's own cursor class or row factory may differ)."""
    cur = psycopg.Cursor(conn, row_factory=tuple_row)
    return _read(cur.execute(DETECT, prepare=False).fetchone())


def _read(row: Any) -> ServerCapabilities:
    assert row is not None
    product, version_num, yb_listen_notify = row
    return ServerCapabilities.from_server(str(product), int(version_num), bool(yb_listen_notify))
