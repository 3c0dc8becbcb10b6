"""``settings.RIVER_ANYIO`` and the database URL derived from a ``DATABASES`` entry: each rule
gives a ConfigError naming the key; no URL shown carries its password."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from river_anyio import ConfigError
from river_anyio.drivers import redact_url

pytest.importorskip("django")

from river_anyio.contrib.django._settings import alias_url, parse

DATABASES = {
    "default": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop"},
    "files": {"ENGINE": "django.db.backends.sqlite3", "NAME": "shop.sqlite3"},
}


def test_the_defaults() -> None:
    config = parse(None, DATABASES)
    assert config.alias == "default" and config.default_using == "default"
    assert config.workers is None and config.queues is None and config.schema is None
    assert config.loop == "asyncio" and config.soft_stop_timeout is None


def test_every_key() -> None:
    config = parse(
        {
            "DATABASE": "files",
            "SCHEMA": "river",
            "WORKERS": "shop.jobs:workers",
            "QUEUES": {"default": 10, "mail": 2},
            "SOFT_STOP_TIMEOUT": 5,
            "LOOP": "trio",
            "CLIENT_OPTIONS": {"pool_size": 2},
        },
        DATABASES,
    )
    assert config.alias == "files" and config.default_using == "files"
    assert config.workers == ("shop.jobs", "workers")
    assert config.queues == (("default", 10), ("mail", 2))
    assert config.soft_stop_timeout == 5.0 and config.loop == "trio"
    assert config.client_options == {"pool_size": 2}


def test_a_url_as_database_enqueues_through_the_default_connection() -> None:
    config = parse({"DATABASE": "postgresql://app:pw@db/shop"}, DATABASES)
    assert config.alias is None and config.default_using == "default"
    assert config.database == "postgresql://app:pw@db/shop"


@pytest.mark.parametrize(
    ("value", "field", "rule"),
    [
        ([], "RIVER_ANYIO", "must be a dict"),
        ({"QUEUE": {}}, "RIVER_ANYIO", "unknown key(s) QUEUE"),
        ({"DATABASE": "other"}, "RIVER_ANYIO['DATABASE']", "neither a DATABASES alias"),
        ({"DATABASE": "mysql://x/y"}, "RIVER_ANYIO['DATABASE']", "postgres"),
        ({"DATABASE": ""}, "RIVER_ANYIO['DATABASE']", "alias or a database URL"),
        ({"SCHEMA": ""}, "RIVER_ANYIO['SCHEMA']", "non-empty"),
        ({"WORKERS": "shop.jobs"}, "RIVER_ANYIO['WORKERS']", "MODULE:ATTR"),
        ({"WORKERS": 3}, "RIVER_ANYIO['WORKERS']", "MODULE:ATTR"),
        ({"QUEUES": {}}, "RIVER_ANYIO['QUEUES']", "non-empty dict"),
        ({"QUEUES": {"default": "10"}}, "RIVER_ANYIO['QUEUES']", "an int"),
        ({"QUEUES": {"default": 0}}, "RIVER_ANYIO['QUEUES']", "between 1 and 10,000"),
        ({"QUEUES": {"no spaces": 1}}, "RIVER_ANYIO['QUEUES']", "queue"),
        ({"SOFT_STOP_TIMEOUT": -1}, "RIVER_ANYIO['SOFT_STOP_TIMEOUT']", ">= 0"),
        ({"LOOP": "uvloop"}, "RIVER_ANYIO['LOOP']", "asyncio, trio"),
        ({"CLIENT_OPTIONS": [1]}, "RIVER_ANYIO['CLIENT_OPTIONS']", "keyword arguments"),
    ],
)
def test_bad_settings_name_the_key(value: object, field: str, rule: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse(value, DATABASES)
    assert info.value.field == field
    assert rule in info.value.rule


def test_a_postgresql_entry_becomes_a_libpq_string_with_its_libpq_options() -> None:
    entry = {
        "NAME": "shop",
        "USER": "app",
        "PASSWORD": "s3cret pw",
        "HOST": "db.internal",
        "PORT": 6432,
        "OPTIONS": {"sslmode": "require", "pool": True, "isolation_level": 2},
    }
    url = alias_url("default", entry, "postgresql")
    from psycopg.conninfo import conninfo_to_dict

    assert conninfo_to_dict(url) == {
        "dbname": "shop",
        "user": "app",
        "password": "s3cret pw",
        "host": "db.internal",
        "port": "6432",
        "sslmode": "require",
    }
    assert "s3cret" not in redact_url(url)


def test_a_sqlite_entry_becomes_the_absolute_path_of_its_file(tmp_path: Path) -> None:
    assert alias_url("files", {"NAME": tmp_path / "a.db"}, "sqlite") == f"sqlite://{tmp_path}/a.db"
    relative = alias_url("files", {"NAME": "a.db"}, "sqlite")
    assert relative == f"sqlite://{os.path.abspath('a.db')}"


@pytest.mark.parametrize("name", [":memory:", "file:memdb1?mode=memory&cache=shared", ""])
def test_an_in_memory_sqlite_database_cannot_be_shared_with_a_worker(name: str) -> None:
    with pytest.raises(ConfigError, match="path of a SQLite file") as info:
        alias_url("files", {"NAME": name}, "sqlite")
    assert info.value.field == "DATABASES['files']['NAME']"


def test_other_backends_are_refused() -> None:
    with pytest.raises(ConfigError, match="PostgreSQL and SQLite backends, not 'mysql'"):
        alias_url("default", {"NAME": "shop"}, "mysql")


def test_the_howtos_code_is_the_test_projects() -> None:
    """The how-to's jobs module and view are the tested project's, word for word."""
    root = Path(__file__).resolve().parents[2]
    page = (root / "docs/howto/django.md").read_text()
    shown = 0
    for marker, code in re.findall(
        r"<!-- not-run: (\S+), run by the test suite -->\n```python\n(.*?)```", page, re.S
    ):
        assert code in (root / marker).read_text(), marker
        shown += 1
    assert shown == 2
