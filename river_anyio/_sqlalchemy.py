"""Reaching the DBAPI connection inside an SQLAlchemy ``Connection``/``Session`` (blocking) or
``AsyncConnection``/``AsyncSession`` (asyncio), so River's statements run in the caller's
SQLAlchemy transaction.

SQLAlchemy is optional: nothing here imports it unless the caller's object already comes from
it (an object cannot be an SQLAlchemy connection unless SQLAlchemy is imported). When the
connection or session has no transaction yet, one is begun, as SQLAlchemy itself does on the
first ``execute()``; committing or rolling it back stays the caller's.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

__all__ = ["async_dbapi_connection", "is_async_sqlalchemy", "sync_dbapi_connection"]


def _name(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def is_async_sqlalchemy(obj: object) -> bool:
    """Whether ``obj`` is an SQLAlchemy ``AsyncConnection`` or ``AsyncSession``."""
    mod = sys.modules.get("sqlalchemy.ext.asyncio")
    return mod is not None and isinstance(obj, mod.AsyncConnection | mod.AsyncSession)


def sync_dbapi_connection(obj: object) -> Any:
    """The DBAPI (driver) connection of an SQLAlchemy ``Connection`` or ``Session``, its
    transaction begun; None when ``obj`` is neither. TypeError for the async kinds."""
    engine = sys.modules.get("sqlalchemy.engine")
    if engine is None:
        return None
    if is_async_sqlalchemy(obj):
        raise TypeError(
            f"an SQLAlchemy {type(obj).__name__} is async: pass it to river_anyio.Client's "
            "insert_tx(), or give the blocking client a Connection/Session"
        )
    orm = sys.modules.get("sqlalchemy.orm")
    if orm is not None and isinstance(obj, orm.Session):
        conn = obj.connection()  # begins the session's transaction if none
    elif isinstance(obj, engine.Connection):
        conn = obj
        if not conn.in_transaction():
            conn.begin()
    else:
        return None
    return conn.connection.driver_connection


async def async_dbapi_connection(obj: object) -> Any:
    """The driver connection (``psycopg.AsyncConnection``) of an SQLAlchemy
    ``AsyncConnection``/``AsyncSession``, its transaction begun. asyncio only."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        raise TypeError(
            "SQLAlchemy's AsyncConnection/AsyncSession work only under asyncio (SQLAlchemy's "
            "asyncio layer runs on greenlet and asyncio); under trio pass a "
            "river_anyio.drivers.postgres.AnyioConnection or a transaction of the client"
        ) from None
    from sqlalchemy.ext.asyncio import AsyncSession

    if isinstance(obj, AsyncSession):
        conn = await obj.connection()  # begins the session's transaction if none
    else:
        conn = obj  # type: ignore[assignment]
        if not conn.in_transaction():
            await conn.begin()
    raw = await conn.get_raw_connection()
    return raw.driver_connection
