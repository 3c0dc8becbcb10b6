"""Decoding stored args JSON into args classes (cattrs, used only at this boundary)."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any, TypeVar

import cattrs

from ._timeutil import parse_rfc3339

__all__ = ["structure_args"]

T = TypeVar("T")

_converter = cattrs.Converter(forbid_extra_keys=False)
_converter.register_structure_hook(
    dt.datetime, lambda v, _t: v if isinstance(v, dt.datetime) else parse_rfc3339(v)
)
_converter.register_structure_hook(
    uuid.UUID, lambda v, _t: v if isinstance(v, uuid.UUID) else uuid.UUID(v)
)


def structure_args(data: Any, cls: type[T]) -> T:
    """Args of ``cls`` from their decoded JSON (unknown keys are ignored, as Go does)."""
    return _converter.structure(data, cls)
