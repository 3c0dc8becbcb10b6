"""A blocking River client, for code that is not an AnyIO program (Django and Flask views,
scripts, threads): insert jobs (alone, in batches, or inside the caller's own transaction on
psycopg, apsw, ``sqlite3`` or SQLAlchemy) and manage jobs and queues::

    from river_anyio import blocking

    with blocking.Client("postgresql://localhost/app") as client:
        client.insert(SendEmail(to="a@example.com"))
        with psycopg.connect(url) as conn:  # one transaction: the row and its job
            conn.execute("INSERT INTO orders ...")
            client.insert_tx(conn, ShipOrder(order_id=42))

It runs the async client's own code (validation, option precedence, unique keys, middleware,
insert notifications) over blocking connections; no event loop is started.
"""

from __future__ import annotations

import contextlib

from ._client import DRIVER_OPTIONS, Client, Jobs, Queues

__all__ = ("DRIVER_OPTIONS", "Client", "Jobs", "Queues")


def _fixup_module_metadata() -> None:
    # Tracebacks and docs should say river_anyio.blocking.Client, not ..._client.Client.
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith(__name__ + "._"):
            with contextlib.suppress(AttributeError, TypeError):
                obj.__module__ = __name__


_fixup_module_metadata()
del _fixup_module_metadata
