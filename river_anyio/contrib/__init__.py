"""Integrations with other libraries, each behind its own extra (``river_anyio[starlette]``)."""

from __future__ import annotations

__all__ = ()
