"""The Django app: ``INSTALLED_APPS += ["river_anyio.contrib.django"]``."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig
from django.core import checks


class RiverAnyioConfig(AppConfig):  # type: ignore[misc]
    """Registers the system check of ``RIVER_ANYIO`` and the management commands."""

    name = "river_anyio.contrib.django"
    label = "river_anyio"
    verbose_name = "River (river_anyio)"

    def ready(self) -> None:
        checks.register(check_settings)


def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """``manage.py check`` (and runserver, migrate): ``RIVER_ANYIO`` is valid and the
    connections it enqueues through can carry River's inserts, without connecting."""
    from django.db import connections
    from django.db.utils import ConnectionDoesNotExist

    from ..._errors import ConfigError
    from ...drivers import redact_url
    from . import check_driver, river_settings

    try:
        config = river_settings()
        conn = connections[config.default_using]
        check_driver(config.default_using, conn.vendor, getattr(conn, "Database", None))
    except ConfigError as exc:
        return [checks.Error(redact_url(str(exc)), id="river_anyio.E001")]
    except ConnectionDoesNotExist:
        return [
            checks.Error(
                f"RIVER_ANYIO['DATABASE'] is a URL, so jobs are enqueued through "
                f"DATABASES[{config.default_using!r}], which does not exist",
                hint="add it, or pass using= to every insert",
                id="river_anyio.E001",
            )
        ]
    return []
