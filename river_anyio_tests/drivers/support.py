"""Helpers shared by the driver tests."""

from __future__ import annotations

import json
from typing import Any

from river_anyio import JobState
from river_anyio.drivers import JobInsertParams


def params(n: int = 0, *, kind: str = "conformance", **kw: Any) -> JobInsertParams:
    """A ready-to-insert job with args ``{"n": n}`` and River's defaults, overridable."""
    base: dict[str, Any] = {
        "encoded_args": json.dumps({"n": n}).encode(),
        "kind": kind,
        "max_attempts": 25,
        "metadata": b"{}",
        "priority": 1,
        "queue": "default",
        "state": JobState.AVAILABLE,
        "tags": (),
    }
    base.update(kw)
    return JobInsertParams(**base)


def ph(url: str) -> str:
    """The backend's placeholder for raw SQL in tests."""
    return "?" if url.startswith("sqlite:") else "%s"
