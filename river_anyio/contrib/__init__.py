"""Optional integrations, each behind its own extra (``pip install river_anyio[NAME]``)."""

from __future__ import annotations

__all__ = ()
