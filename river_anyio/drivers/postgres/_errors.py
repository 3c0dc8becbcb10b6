"""Translation of psycopg exceptions into river_anyio's exception tree."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

import psycopg
from psycopg import errors as pg_errors

from ..._errors import (
    ConnectionLostError,
    DatabaseError,
    IntegrityError,
    QueryCanceledError,
    UniqueViolationError,
)

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["is_cached_plan_error", "map_errors", "translate_error"]

# SQLSTATEs that mean "this connection is gone": class 08 (connection exception) and the
# server shutting down or not accepting connections (57P01..57P03).
_CONNECTION_SQLSTATES = frozenset({"57P01", "57P02", "57P03"})
# The transaction lost a race with another (serialization failure, deadlock): running it again
# is the remedy, so background services retry it and the completer requeues its batch.
_RACE_SQLSTATES = frozenset({"40001", "40P01"})


def translate_error(exc: psycopg.Error) -> DatabaseError:
    """The river_anyio exception for a psycopg one (the caller chains the cause)."""
    sqlstate = exc.sqlstate
    message = str(exc) or type(exc).__name__
    if isinstance(exc, pg_errors.UniqueViolation):
        return UniqueViolationError(message, sqlstate=sqlstate)
    if isinstance(exc, psycopg.IntegrityError):
        return IntegrityError(message, sqlstate=sqlstate)
    if isinstance(exc, pg_errors.QueryCanceled):
        return QueryCanceledError(message, sqlstate=sqlstate)
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError) and (
        sqlstate is None or sqlstate.startswith("08") or sqlstate in _CONNECTION_SQLSTATES
    ):
        # Client-side failures (no SQLSTATE: socket closed, connect refused or timed out,
        # "the connection is closed") and server-reported connection loss.
        return ConnectionLostError(message, sqlstate=sqlstate)
    error = DatabaseError(message, sqlstate=sqlstate)
    if sqlstate in _RACE_SQLSTATES:
        error.transient = True
    return error


@contextmanager
def map_errors() -> Iterator[None]:
    """Re-raise psycopg exceptions as river_anyio ones, keeping the original as the cause."""
    try:
        yield
    except psycopg.Error as exc:
        raise translate_error(exc) from exc


def is_cached_plan_error(exc: BaseException) -> bool:
    """Whether a prepared statement went stale after DDL on another connection."""
    return isinstance(exc, pg_errors.FeatureNotSupported) and "cached plan must not change" in str(
        exc
    )
