"""The ``RIVER_ANYIO`` setting, read and checked: which database, and the worker's defaults.

Pure functions of the setting and of Django's database entries, so that every rule is checked
(and tested) without a configured Django.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Literal

import attrs

from ..._errors import ConfigError
from ...drivers import dialect_of_url, redact_url

__all__ = ["DEFAULT_ALIAS", "SETTING", "RiverSettings", "alias_url", "parse", "vendor_dialect"]

SETTING = "RIVER_ANYIO"
DEFAULT_ALIAS = "default"
#: The keys of ``settings.RIVER_ANYIO``; any other is a ConfigError (a misspelt key would
#: otherwise be ignored silently).
KEYS = (
    "DATABASE",
    "SCHEMA",
    "WORKERS",
    "QUEUES",
    "SOFT_STOP_TIMEOUT",
    "LOOP",
    "CLIENT_OPTIONS",
)
LOOPS = ("asyncio", "trio")
#: Keys of a PostgreSQL entry's ``OPTIONS`` that are Django's own, not libpq parameters.
_DJANGO_PG_OPTIONS = frozenset(
    {"isolation_level", "server_side_binding", "pool", "assume_role", "cursor_factory"}
)

Dialect = Literal["postgres", "sqlite"]


@attrs.frozen(kw_only=True)
class RiverSettings:
    """``settings.RIVER_ANYIO``, checked.

    ``alias`` is the ``DATABASES`` entry the database comes from (and the connection
    :func:`~river_anyio.contrib.django.insert` uses by default); ``None`` when ``DATABASE``
    is a URL, whose password ``display`` hides.
    """

    database: str
    alias: str | None
    schema: str | None
    workers: tuple[str, str] | None
    queues: tuple[tuple[str, int], ...] | None
    soft_stop_timeout: float | None
    loop: str
    client_options: Mapping[str, Any]

    @property
    def default_using(self) -> str:
        """The Django connection enqueues go through when ``using`` is not given."""
        return self.alias or DEFAULT_ALIAS


def _field(key: str) -> str:
    return f"{SETTING}[{key!r}]"


def parse(value: object, databases: Mapping[str, Any]) -> RiverSettings:
    """``settings.RIVER_ANYIO`` (``None`` when unset) checked against ``settings.DATABASES``.

    Raises:
        ConfigError: naming the key at fault and the rule it breaks.
    """
    from ..._worker_cli import _app_spec, _queue_flag

    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise ConfigError(SETTING, f"must be a dict, not {type(value).__name__}")
    unknown = sorted(str(k) for k in value if k not in KEYS)
    if unknown:
        raise ConfigError(
            SETTING, f"unknown key(s) {', '.join(unknown)}; the keys are {', '.join(KEYS)}"
        )
    database = value.get("DATABASE", DEFAULT_ALIAS)
    if not isinstance(database, str) or not database:
        raise ConfigError(_field("DATABASE"), "must be a DATABASES alias or a database URL")
    alias: str | None = None
    if database in databases:
        alias = database
    elif ":" in database or "=" in database:
        try:
            dialect_of_url(database)
        except ConfigError as exc:
            raise ConfigError(_field("DATABASE"), exc.rule) from None
    else:
        raise ConfigError(
            _field("DATABASE"),
            f"{database!r} is neither a DATABASES alias ({', '.join(map(repr, databases))}) "
            "nor a database URL",
        )

    schema = value.get("SCHEMA")
    if schema is not None and (not isinstance(schema, str) or not schema):
        raise ConfigError(_field("SCHEMA"), "must be a non-empty str or None")

    workers = value.get("WORKERS")
    spec: tuple[str, str] | None = None
    if workers is not None:
        if not isinstance(workers, str):
            raise ConfigError(_field("WORKERS"), "must be a 'MODULE:ATTR' string")
        try:
            spec = _app_spec(workers)
        except Exception as exc:  # argparse.ArgumentTypeError
            raise ConfigError(_field("WORKERS"), str(exc)) from None

    queues = value.get("QUEUES")
    checked_queues: tuple[tuple[str, int], ...] | None = None
    if queues is not None:
        if not isinstance(queues, Mapping) or not queues:
            raise ConfigError(
                _field("QUEUES"),
                'must be a non-empty dict of queue name to max workers, e.g. {"default": 100}',
            )
        items = []
        for name, count in queues.items():
            if not isinstance(name, str) or isinstance(count, bool) or not isinstance(count, int):
                raise ConfigError(
                    _field("QUEUES"), f"{name!r}: must map a queue name (str) to an int"
                )
            try:
                items.append(_queue_flag(f"{name}={count}"))
            except Exception as exc:  # argparse.ArgumentTypeError
                raise ConfigError(_field("QUEUES"), str(exc)) from None
        checked_queues = tuple(items)

    timeout = value.get("SOFT_STOP_TIMEOUT")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout < 0
    ):
        raise ConfigError(_field("SOFT_STOP_TIMEOUT"), "must be a number of seconds >= 0, or None")

    loop = value.get("LOOP", "asyncio")
    if loop not in LOOPS:
        raise ConfigError(_field("LOOP"), f"must be one of {', '.join(LOOPS)}, got {loop!r}")

    options = value.get("CLIENT_OPTIONS", {})
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise ConfigError(_field("CLIENT_OPTIONS"), "must be a dict of keyword arguments")
    return RiverSettings(
        database=database,
        alias=alias,
        schema=schema,
        workers=spec,
        queues=checked_queues,
        soft_stop_timeout=None if timeout is None else float(timeout),
        loop=loop,
        client_options=dict(options),
    )


def vendor_dialect(alias: str, vendor: str) -> Dialect:
    """The River dialect of a Django connection's vendor; others are a ConfigError."""
    if vendor == "postgresql":
        return "postgres"
    if vendor == "sqlite":
        return "sqlite"
    raise ConfigError(
        f"DATABASES[{alias!r}]",
        f"river_anyio works with Django's PostgreSQL and SQLite backends, not {vendor!r}",
    )


def alias_url(alias: str, settings_dict: Mapping[str, Any], vendor: str) -> str:
    """The database URL of a Django ``DATABASES`` entry (a connection's ``settings_dict``).

    PostgreSQL: a libpq key/value string of ``NAME``, ``USER``, ``PASSWORD``, ``HOST``,
    ``PORT`` and the libpq parameters among ``OPTIONS`` (``sslmode``, ``service``, ...).
    SQLite: ``sqlite://`` and the absolute path of ``NAME``; an in-memory database is a
    ConfigError, as a worker process could not open it.
    """
    field = f"DATABASES[{alias!r}]"
    dialect = vendor_dialect(alias, vendor)
    if dialect == "sqlite":
        name = os.fspath(settings_dict.get("NAME") or "")
        if not name or name == ":memory:" or "mode=memory" in name or name.startswith("file:"):
            raise ConfigError(
                f"{field}['NAME']",
                f"must be the path of a SQLite file for river_anyio (workers open it from "
                f"another process), not {name!r}",
            )
        return f"sqlite://{os.path.abspath(name)}"
    from psycopg import pq
    from psycopg.conninfo import make_conninfo

    libpq_keys = {opt.keyword.decode() for opt in pq.Conninfo.get_defaults()}
    params: dict[str, Any] = {}
    for key, param in (
        ("NAME", "dbname"),
        ("USER", "user"),
        ("PASSWORD", "password"),
        ("HOST", "host"),
        ("PORT", "port"),
    ):
        if settings_dict.get(key):
            params[param] = str(settings_dict[key])
    for key, option in (settings_dict.get("OPTIONS") or {}).items():
        if key in libpq_keys and key not in _DJANGO_PG_OPTIONS and option is not None:
            params[key] = str(option)
    return make_conninfo("", **params)


def display(url: str) -> str:
    """A database URL as it may be printed: its password hidden."""
    return redact_url(url)
