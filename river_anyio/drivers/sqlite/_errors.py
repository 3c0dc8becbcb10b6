"""Translation of apsw exceptions into river_anyio's error tree.

apsw exceptions never leave the SQLite driver: :func:`translate` maps them and the caller raises
the result ``from`` the original, so the apsw error stays available as ``__cause__``.
"""

from __future__ import annotations

import apsw

from ..._errors import (
    ConnectionLostError,
    DatabaseBusyError,
    DatabaseError,
    IntegrityError,
    QueryCanceledError,
    UniqueViolationError,
)

__all__ = ["translate"]

# Extended result codes of a constraint failure that means "duplicate key".
_UNIQUE_CODES = frozenset({apsw.SQLITE_CONSTRAINT_UNIQUE, apsw.SQLITE_CONSTRAINT_PRIMARYKEY})

# The file could not be opened or I/O failed: possibly transient (disk, mount, permissions
# being fixed). Corruption or "not a database" are not, and stay plain DatabaseError.
_LOST = (
    apsw.CantOpenError,
    apsw.ConnectionClosedError,
    apsw.IOError,
    apsw.VFSFileClosedError,
)


def _message(exc: apsw.Error) -> str:
    text = str(exc) or type(exc).__name__
    return f"sqlite: {text}"


def translate(exc: apsw.Error) -> DatabaseError:
    """The river_anyio error for an apsw error (not raised; the caller raises it ``from exc``)."""
    msg = _message(exc)
    if isinstance(exc, apsw.BusyError | apsw.LockedError):
        return DatabaseBusyError(msg)
    if isinstance(exc, apsw.ConstraintError):
        if getattr(exc, "extendedresult", None) in _UNIQUE_CODES:
            return UniqueViolationError(msg)
        return IntegrityError(msg)
    if isinstance(exc, apsw.InterruptError):
        return QueryCanceledError(msg)
    if isinstance(exc, _LOST):
        return ConnectionLostError(msg)
    return DatabaseError(msg)
