"""Enqueue River jobs from Django, in Django's own transactions (``river_anyio[django]``).

Add the app and, optionally, the ``RIVER_ANYIO`` setting::

    INSTALLED_APPS = [..., "river_anyio.contrib.django"]
    RIVER_ANYIO = {"DATABASE": "default", "WORKERS": "shop.jobs:workers"}

then enqueue in a view; the job is committed with the view's rows, or not at all::

    with transaction.atomic():
        order = Order.objects.create(item=item)
        river_anyio.contrib.django.insert(ShipOrder(order_id=order.id))

The insert runs on Django's connection for ``using`` (its ``psycopg.Connection`` on the
PostgreSQL backend with psycopg 3, its ``sqlite3.Connection`` on the SQLite backend), inside
the current ``transaction.atomic()`` block, or in one of its own when there is none. One
:class:`river_anyio.blocking.Client`, built at the first call from the settings, serves the
process. ``manage.py river_worker`` works the jobs and ``manage.py river_migrate`` applies
River's schema.
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import attrs

from ..._errors import ConfigError
from ...drivers import dialect_of_url
from ._settings import RiverSettings, alias_url, parse, vendor_dialect

if TYPE_CHECKING:
    from ... import blocking
    from ..._insert import InsertManyParams
    from ..._job import InsertOpts, InsertResult, JobArgs

__all__ = [
    "close_client",
    "database_url",
    "get_client",
    "insert",
    "insert_many",
    "insert_many_fast",
    "river_settings",
]


@attrs.frozen(kw_only=True)
class _Built:
    settings: RiverSettings
    dialect: str  # of River's database
    client: blocking.Client


_lock = threading.Lock()
_built: list[_Built] = []  # at most one: the process's client
_checked: set[str] = set()  # aliases whose driver has been checked
_atexit: list[object] = []


def river_settings() -> RiverSettings:
    """``settings.RIVER_ANYIO`` read and checked (a ConfigError names the key at fault)."""
    from django.conf import settings

    return parse(getattr(settings, "RIVER_ANYIO", None), settings.DATABASES)


def database_url(config: RiverSettings | None = None) -> str:
    """The URL the process's client and ``manage.py river_worker`` open: ``DATABASE`` when it
    is a URL, else the libpq string or ``sqlite://`` path of that ``DATABASES`` entry (as the
    connection has it now: a test database once Django's test runner has made one). It holds
    the password: print ``river_anyio.drivers.redact_url(url)`` instead."""
    config = config or river_settings()
    if config.alias is None:
        return config.database
    from django.db import connections

    conn = connections[config.alias]
    return alias_url(config.alias, conn.settings_dict, conn.vendor)


def get_client() -> blocking.Client:
    """The process's :class:`~river_anyio.blocking.Client`, built at the first call from
    ``RIVER_ANYIO`` (``DATABASE``, ``SCHEMA`` and ``CLIENT_OPTIONS``). Thread-safe."""
    return _current().client


def _current() -> _Built:
    with _lock:
        if _built:
            return _built[0]
        from django.db import connections

        from ... import blocking

        config = river_settings()
        url = database_url(config)
        options = dict(config.client_options)
        conn = connections[config.default_using]
        check_driver(config.default_using, conn.vendor, getattr(conn, "Database", None))
        if conn.vendor == "sqlite" and dialect_of_url(url) == "sqlite":
            # the client's own connections use Django's sqlite3 module: two SQLite libraries
            # on one file in one process break each other's locks
            driver_options = dict(options.pop("driver_options", None) or {})
            driver_options.setdefault("sqlite_module", conn.Database)
            options["driver_options"] = driver_options
        client = blocking.Client(url, schema=config.schema, **options)
        _built.append(_Built(settings=config, dialect=dialect_of_url(url), client=client))
        if not _atexit:
            _atexit.append(atexit.register(close_client))
        return _built[0]


def close_client() -> None:
    """Close the process's client, if built; the next enqueue builds a new one. Called at
    exit, and when a test changes ``RIVER_ANYIO`` or ``DATABASES`` (``override_settings``)."""
    with _lock:
        built = _built[:]
        _built.clear()
        _checked.clear()
    for b in built:
        b.client.close()


def check_driver(alias: str, vendor: str, database_module: Any) -> None:
    """Raise a ConfigError when Django's connection ``alias`` cannot carry River's inserts:
    psycopg2 under the PostgreSQL backend, or a ``sqlite3`` module bundling SQLite older than
    river_anyio's SQLite driver needs (3.47: River's tables use JSONB)."""
    field = f"DATABASES[{alias!r}]"
    dialect = vendor_dialect(alias, vendor)
    if dialect == "postgres":
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        if not is_psycopg3:
            raise ConfigError(
                field,
                "Django's PostgreSQL backend is using psycopg2; river_anyio needs psycopg 3: "
                "pip install 'psycopg[binary]'",
            )
        return
    from ...drivers.sqlite._connection import MIN_SQLITE_VERSION

    version = tuple(database_module.sqlite_version_info)
    if version < MIN_SQLITE_VERSION:
        need = ".".join(map(str, MIN_SQLITE_VERSION[:2]))
        raise ConfigError(
            field,
            f"Django's SQLite backend uses the {database_module.__name__} module, which "
            f"bundles SQLite {database_module.sqlite_version}; River's tables need SQLite "
            f"{need} or later (JSONB). Fix: pip install pysqlite3-binary, and put it in place "
            f"of sqlite3 before Django loads (at the top of settings.py: "
            f"import sys, pysqlite3; sys.modules['sqlite3'] = pysqlite3), or use a Python "
            f"built with SQLite {need}+",
        )


def _connection(using: str | None) -> tuple[Any, str]:
    """Django's connection for ``using``, checked once per alias."""
    from django.db import connections

    built = _current()
    alias = using or built.settings.default_using
    conn = connections[alias]
    if alias not in _checked:
        check_driver(alias, conn.vendor, getattr(conn, "Database", None))
        if built.dialect != vendor_dialect(alias, conn.vendor):
            raise ConfigError(
                "using",
                f"DATABASES[{alias!r}] is {conn.vendor}, but River's database "
                f"(RIVER_ANYIO['DATABASE']) is {built.dialect}",
            )
        _checked.add(alias)
    return conn, alias


def _in_transaction(using: str | None, call: Any) -> Any:
    from django.db import transaction

    conn, alias = _connection(using)
    client = get_client()
    if conn.in_atomic_block:
        conn.ensure_connection()
        return call(client, conn.connection)
    with transaction.atomic(using=alias):
        return call(client, conn.connection)


def insert(
    args: JobArgs, opts: InsertOpts | None = None, *, using: str | None = None
) -> InsertResult:
    """Insert a job through Django's connection ``using`` (default: the ``DATABASE`` alias,
    else ``"default"``), in the current ``transaction.atomic()`` block: it is committed with
    the block, or rolled back with it. Outside a block it is committed at once.

    Raises:
        ConfigError: The settings, or the connection's driver, cannot carry River's inserts
            (checked at the first call for each alias).
        ValidationError: As :meth:`river_anyio.blocking.Client.insert_tx`.
    """
    result: InsertResult = _in_transaction(using, lambda c, raw: c.insert_tx(raw, args, opts))
    return result


def insert_many(
    params: Iterable[JobArgs | InsertManyParams], *, using: str | None = None
) -> list[InsertResult]:
    """Insert several jobs through Django's connection, as :func:`insert` inserts one."""
    items = list(params)
    result: list[InsertResult] = _in_transaction(using, lambda c, raw: c.insert_many_tx(raw, items))
    return result


def insert_many_fast(
    params: Iterable[JobArgs | InsertManyParams], *, using: str | None = None
) -> int:
    """Insert several jobs through Django's connection by the fast path (no unique jobs, no
    per-job results), as :func:`insert` inserts one; returns how many were inserted."""
    items = list(params)
    result: int = _in_transaction(using, lambda c, raw: c.insert_many_fast_tx(raw, items))
    return result


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting in ("RIVER_ANYIO", "DATABASES"):
        close_client()


try:
    from django.test.signals import setting_changed
except ImportError:  # pragma: no cover - without Django the module still imports (docs)
    pass
else:
    setting_changed.connect(_on_setting_changed, dispatch_uid="river_anyio.contrib.django")
