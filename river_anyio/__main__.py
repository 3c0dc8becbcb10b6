"""``python -m river_anyio``: the same command line as ``river-anyio``."""

from __future__ import annotations

from ._cli import main

raise SystemExit(main())
