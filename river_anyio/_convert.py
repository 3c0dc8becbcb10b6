"""Decoding stored args JSON into args classes (cattrs, used only at this boundary).

Fields are read under the names the encoder writes them (``_gojson``): an attrs field's
``metadata["json"]`` when set, as Go's ``json:"name"`` tag; a field named ``"-"`` is never read
(it keeps its default), as Go ignores ``json:"-"`` fields when decoding.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import cattrs
from cattrs.gen import make_dict_structure_fn, override

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


def _renames_fields(cls: Any) -> bool:
    return attrs.has(cls) and any("json" in f.metadata for f in attrs.fields(cls))


def _structure_with_json_names(cls: Any) -> Any:
    overrides = {}
    for field in attrs.fields(cls):
        name = field.metadata.get("json")
        if name == "-":
            overrides[field.name] = override(omit=True)
        elif isinstance(name, str) and name != field.name:
            overrides[field.name] = override(rename=name)
    return make_dict_structure_fn(cls, _converter, **overrides)  # type: ignore[arg-type]


_converter.register_structure_hook_factory(_renames_fields, _structure_with_json_names)


def structure_hook(cls: type[T]) -> Callable[[Any, type[T]], T]:
    """The function :func:`structure_args` calls for ``cls`` (looked up once by callers that
    decode many args of one class)."""
    return _converter.get_structure_hook(cls)


def structure_args(data: Any, cls: type[T]) -> T:
    """Args of ``cls`` from their decoded JSON (unknown keys are ignored, as Go does)."""
    return _converter.structure(data, cls)
