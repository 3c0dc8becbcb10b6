"""The app in this process, with Django configured here (no database is connected to): the
system check, the process's client following ``override_settings``, and the rules checked at
the first enqueue."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("django")

import django
from django.conf import settings
from django.test.utils import override_settings

import river_anyio.contrib.django as river_django
from river_anyio import ConfigError
from river_anyio.contrib.django.apps import check_settings

PG = {"ENGINE": "django.db.backends.postgresql", "NAME": "shop", "PASSWORD": "s3cret-pw"}


@pytest.fixture(scope="module", autouse=True)
def django_configured() -> None:
    if not settings.configured:
        settings.configure(
            DATABASES={"default": PG},
            INSTALLED_APPS=["river_anyio.contrib.django"],
            LOGGING_CONFIG=None,
            USE_TZ=True,
        )
        django.setup()


@pytest.fixture
def river(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """RIVER_ANYIO on a SQLite file no Django connection is on (nothing connects to it)."""
    value = {"DATABASE": f"sqlite://{tmp_path / 'river.sqlite3'}"}
    with override_settings(RIVER_ANYIO=value):
        yield value
    river_django.close_client()


def test_the_check_passes_with_good_settings(river: dict[str, Any]) -> None:
    assert check_settings() == []


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ({"QUEUES": {}}, "RIVER_ANYIO['QUEUES']: must be a non-empty dict"),
        ({"LOOP": "uvloop"}, "RIVER_ANYIO['LOOP']: must be one of asyncio, trio"),
        ({"DATABASE": "mysql://app:s3cret-pw@db/shop"}, "RIVER_ANYIO['DATABASE']: "),
    ],
)
def test_the_check_names_the_bad_key(value: dict[str, Any], message: str) -> None:
    with override_settings(RIVER_ANYIO=value):
        (error,) = check_settings()
    assert error.id == "river_anyio.E001"
    assert error.msg.startswith(message), error.msg
    assert "s3cret" not in error.msg


def test_one_client_per_settings(river: dict[str, Any], tmp_path: Path) -> None:
    client = river_django.get_client()
    assert river_django.get_client() is client
    with override_settings(RIVER_ANYIO={"DATABASE": f"sqlite://{tmp_path / 'other.sqlite3'}"}):
        other = river_django.get_client()  # the setting changed: a client of its own
        assert other is not client
    assert river_django.get_client() not in (client, other)  # and changed back


def test_an_enqueue_through_a_connection_of_another_kind_is_refused(
    river: dict[str, Any],
) -> None:
    with pytest.raises(ConfigError) as info:
        river_django.insert(object(), using="default")  # type: ignore[arg-type]
    assert info.value.field == "using"
    assert "DATABASES['default'] is postgresql, but River's database" in info.value.rule


def test_the_database_url_of_an_alias_holds_its_password_which_no_message_shows() -> None:
    with override_settings(RIVER_ANYIO={"DATABASE": "default"}):
        url = river_django.database_url()
    assert "password=s3cret-pw" in url and "dbname=shop" in url
