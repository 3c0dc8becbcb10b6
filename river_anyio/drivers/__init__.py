"""Database drivers: one protocol, two implementations (PostgreSQL via psycopg 3, SQLite via apsw).

``open_driver(url)`` picks the implementation from the URL: ``postgres://`` or
``postgresql://`` URLs and libpq key/value strings open PostgreSQL; River's ``sqlite:`` forms
(``sqlite://relative.db``, ``sqlite:///absolute/path.db``) open SQLite. Backends are imported
lazily, so an application needs only the extra it uses (``river_anyio[postgres]`` or
``river_anyio[sqlite]``). ``redact_url`` hides passwords in any text that may quote a URL.

The protocols are public for annotations but unstable for third-party implementers.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import sys
from collections.abc import AsyncIterator
from typing import Any, Final

import anyio
import anyio.to_thread

from .._errors import ConfigError
from ._protocol import (
    TOPIC_CONTROL,
    TOPIC_INSERT,
    TOPIC_LEADERSHIP,
    CompletionResult,
    Dialect,
    Driver,
    Executor,
    InsertedJob,
    JobCompletion,
    JobInsertParams,
    JobListQuery,
    JobRescue,
    LeaderRow,
    LeaseRow,
    LimitedClaim,
    Listener,
    Notification,
    QueueRow,
    ScheduledJob,
)

__all__ = (
    "TOPIC_CONTROL",
    "TOPIC_INSERT",
    "TOPIC_LEADERSHIP",
    "CompletionResult",
    "Dialect",
    "Driver",
    "Executor",
    "InsertedJob",
    "JobCompletion",
    "JobInsertParams",
    "JobListQuery",
    "JobRescue",
    "LeaderRow",
    "LeaseRow",
    "LimitedClaim",
    "Listener",
    "Notification",
    "QueueRow",
    "ScheduledJob",
    "dialect_of_url",
    "open_driver",
    "redact_url",
)


#: A libpq key/value connection string starts with a keyword and ``=`` (``host=db dbname=app``).
_KEYVALUE_RE: Final = re.compile(r"\A\s*[A-Za-z_]+\s*=")


def dialect_of_url(url: str) -> Dialect:
    """The backend a database URL names, or a ConfigError saying which forms are accepted.

    PostgreSQL: ``postgres://`` or ``postgresql://`` URLs and libpq key/value strings
    (``host=db dbname=app``). SQLite: River's ``sqlite:`` forms (see
    :func:`river_anyio.drivers.sqlite.path_from_url`). Only the kind is decided here; the rest of
    the string is checked when the driver opens it.
    """
    if not isinstance(url, str):
        raise ConfigError("database_url", f"must be a str, not {type(url).__name__}")
    scheme, sep, _ = url.partition(":")
    scheme = scheme.strip().lower()
    if sep and scheme in ("postgres", "postgresql"):
        return "postgres"
    if sep and scheme == "sqlite":
        return "sqlite"
    if _KEYVALUE_RE.match(url):
        return "postgres"
    raise ConfigError(
        "database_url",
        "must be a postgres:// or postgresql:// URL, a libpq key/value string "
        f"(host=... dbname=...) or a sqlite: URL such as sqlite://river.db (got {redact_url(url)!r})",
    )


# A URL's user info: everything between "://" and the last "@" before the path. Passwords may
# hold unencoded "/", "@", ":" or "?" (libpq and River's CLI reject those, but a message that
# quotes the bad URL must still hide them), so the match is greedy up to the last "@".
_URL_USERINFO_RE: Final = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s]*)@")
# password=... in a URL query or a key/value string; a key/value value may be single-quoted
# with backslash escapes. sslpassword is libpq's client-key passphrase.
_PASSWORD_RE: Final = re.compile(
    r"(?P<key>\b(?:ssl)?password\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'?|[^\s&]*)", re.IGNORECASE
)


def redact_url(text: object) -> str:
    """``text`` with every database password replaced by ``***``, safe to print or log.

    Covers URL user info (``postgres://user:secret@host``, encoded or not, with ``/`` or ``@``
    in it), ``?password=`` / ``&password=`` query parameters and libpq key/value strings
    (``password=secret``, ``password = 'quoted \\' value'``), anywhere in the text: URLs quoted
    inside error messages are redacted too. Every message river_anyio prints that may contain
    a connection string goes through this function.
    """
    text = text if isinstance(text, str) else str(text)

    def userinfo(m: re.Match[str]) -> str:
        info = m["userinfo"]
        user, colon, _ = info.partition(":")
        if "/" in user:  # no user info after all ("host/db?x=a@b"): keep, but hide a password
            return m[0]
        return f"{m['scheme']}{user}{':***' if colon else ''}@"

    text = _URL_USERINFO_RE.sub(userinfo, text)
    return _PASSWORD_RE.sub(lambda m: f"{m['key']}***", text)


def _password_pieces(url: str) -> list[str]:
    """A connection string's password and the pieces a reader could show of it: with an
    unencoded "@" or "/" in it, libpq splits it elsewhere and quotes a piece as a host or a
    port (``could not translate host name "cret@host"``)."""
    pieces: list[str] = []
    _, sep, rest = url.partition("://")
    if sep and "@" in rest:
        user, colon, password = rest[: rest.rfind("@")].partition(":")
        if colon and "/" not in user:
            pieces += [password, *re.split(r"[@/:?]", password)]
    for m in _PASSWORD_RE.finditer(url):
        value = m["value"]
        pieces += [value, value.strip("'"), *re.split(r"[\s'\\]+", value)]
    return sorted({p for p in pieces if len(p) >= 2}, key=len, reverse=True)


def redact_secrets(text: str, url: str) -> str:
    """:func:`redact_url`, and also every quoted fragment of ``text`` holding a piece of
    ``url``'s password: for messages about ``url`` written by others (libpq, the resolver),
    which quote the host or port a mis-split password became."""
    text = redact_url(text)
    pieces = _password_pieces(url)
    if not pieces:
        return text
    text = re.sub(
        r""""[^"]*"|'[^']*'""",
        lambda m: m[0][0] + "***" + m[0][0] if any(p in m[0] for p in pieces) else m[0],
        text,
    )
    for piece in pieces:
        if len(piece) >= 4:  # a whole password, anywhere (shorter pieces only when quoted)
            text = text.replace(piece, "***")
    return text


def _missing_extra(extra: str, exc: ImportError) -> ConfigError:
    return ConfigError(
        "database_url",
        f"this backend requires river_anyio[{extra}]: pip install 'river_anyio[{extra}]' ({exc})",
    )


_BACKENDS = {"postgres": ("postgres", "psycopg"), "sqlite": ("sqlite", "apsw")}


async def _backend(dialect: Dialect) -> Any:
    """The backend's module, imported in a worker thread: importing psycopg (libpq) or apsw does
    file I/O that must not stall the event loop."""
    extra, dependency = _BACKENDS[dialect]
    name = f"{__name__}.{dialect}"
    if name in sys.modules:
        return sys.modules[name]
    try:
        return await anyio.to_thread.run_sync(importlib.import_module, name)
    except ImportError as exc:
        if exc.name is not None and exc.name.split(".")[0] == dependency:
            raise _missing_extra(extra, exc) from exc
        raise


@contextlib.asynccontextmanager
async def open_driver(
    url: str, *, schema: str | None = None, **options: Any
) -> AsyncIterator[Driver]:
    """Open the driver a URL names; ``options`` go to ``open_postgres``/``open_sqlite``."""
    async with open_dialect_driver(dialect_of_url(url), url, schema=schema, **options) as driver:
        yield driver


@contextlib.asynccontextmanager
async def open_dialect_driver(
    dialect: Dialect, url: str, *, schema: str | None = None, **options: Any
) -> AsyncIterator[Driver]:
    """:func:`open_driver` for a URL whose dialect the caller has already resolved with
    :func:`dialect_of_url` (``open_client`` resolves it once, where its options are checked).
    Internal: not part of the drivers' public surface."""
    backend = await _backend(dialect)
    opener = backend.open_postgres if dialect == "postgres" else backend.open_sqlite
    async with opener(url, schema=schema, **options) as driver:
        yield driver
