"""What the two commands share: the settings, as a CommandError when they are wrong."""

from __future__ import annotations

from typing import Any, TextIO, cast

from django.core.management.base import CommandError, OutputWrapper

from river_anyio._errors import ConfigError
from river_anyio.contrib.django._settings import RiverSettings
from river_anyio.drivers import redact_url


def settings_or_error() -> tuple[RiverSettings, str]:
    """The checked settings and the database URL (with its password: never print it)."""
    from river_anyio.contrib.django import database_url, river_settings

    try:
        config = river_settings()
        return config, database_url(config)
    except ConfigError as exc:
        raise CommandError(redact_url(str(exc)), returncode=2) from None


def text_stream(wrapper: OutputWrapper) -> TextIO:
    """``wrapper`` as the text stream the CLI's functions print to."""
    return cast(TextIO, _Stream(wrapper))


class _Stream:
    """A Django OutputWrapper as the plain text stream ``print`` writes to (OutputWrapper
    adds a line ending to every write, which would double print's own)."""

    def __init__(self, wrapper: OutputWrapper) -> None:
        self._wrapper = wrapper

    def write(self, text: str) -> int:
        self._wrapper.write(text, ending="")
        return len(text)

    def flush(self) -> None:
        self._wrapper.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapper, name)
