"""A small Django project that enqueues River jobs (river_anyio's Django tests run it).

The database comes from ``SHOP_DATABASE_URL``: ``postgresql://user@host:port/name`` or
``sqlite:///absolute/path.sqlite3``. Django's SQLite backend uses the ``sqlite3`` module,
whose SQLite must be 3.47 or later for River's tables; pysqlite3-binary bundles one, and is put
in place of ``sqlite3`` here, before Django loads its SQLite backend (``SHOP_STDLIB_SQLITE=1``
leaves the standard library's module, for the test of the error it gives when too old).
"""

from __future__ import annotations

import os
import sys
import urllib.parse

if os.environ["SHOP_DATABASE_URL"].startswith("sqlite:") and not os.environ.get(
    "SHOP_STDLIB_SQLITE"
):
    import pysqlite3  # type: ignore[import-not-found]

    sys.modules["sqlite3"] = pysqlite3

SECRET_KEY = "river_anyio-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost"]
# the PostgreSQL tests run with USE_TZ = False in a zone other than UTC: Django's connection
# then loads timestamps naive, in that zone
USE_TZ = os.environ.get("SHOP_USE_TZ", "1") == "1"
TIME_ZONE = os.environ.get("SHOP_TIME_ZONE", "UTC")
ROOT_URLCONF = "djproject.urls"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "river_anyio.contrib.django",
    "shop",
]
MIDDLEWARE: list[str] = []
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"


def _database(url: str) -> dict[str, object]:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme == "sqlite":
        return {"ENGINE": "django.db.backends.sqlite3", "NAME": parts.path}
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parts.path.lstrip("/"),
        "USER": urllib.parse.unquote(parts.username or ""),
        "PASSWORD": urllib.parse.unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(parts.port or ""),
    }


DATABASES = {"default": _database(os.environ["SHOP_DATABASE_URL"])}

RIVER_ANYIO = {
    "DATABASE": "default",
    "WORKERS": "shop.jobs:workers",
    "QUEUES": {"default": 10},
    "SOFT_STOP_TIMEOUT": 5,
    "LOOP": os.environ.get("SHOP_LOOP", "asyncio"),
}
