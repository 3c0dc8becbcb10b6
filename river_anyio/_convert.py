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

#: Errors name the field that failed (cattrs' detailed validation): decoding that fails
#: is repeated here for its message.
_converter = cattrs.Converter(forbid_extra_keys=False)
#: The same decoding without the per-field bookkeeping (about 40% faster for a small class).
_fast = cattrs.Converter(forbid_extra_keys=False, detailed_validation=False)


def _renames_fields(cls: Any) -> bool:
    return attrs.has(cls) and any("json" in f.metadata for f in attrs.fields(cls))


def _structure_with_json_names(converter: cattrs.Converter) -> Callable[[Any], Any]:
    def factory(cls: Any) -> Any:
        overrides = {}
        for field in attrs.fields(cls):
            name = field.metadata.get("json")
            if name == "-":
                overrides[field.name] = override(omit=True)
            elif isinstance(name, str) and name != field.name:
                overrides[field.name] = override(rename=name)
        return make_dict_structure_fn(cls, converter, **overrides)  # type: ignore[arg-type]

    return factory


for _c in (_converter, _fast):
    _c.register_structure_hook(
        dt.datetime, lambda v, _t: v if isinstance(v, dt.datetime) else parse_rfc3339(v)
    )
    _c.register_structure_hook(
        uuid.UUID, lambda v, _t: v if isinstance(v, uuid.UUID) else uuid.UUID(v)
    )
    _c.register_structure_hook_factory(_renames_fields, _structure_with_json_names(_c))


def structure_hook(cls: type[T]) -> Callable[[Any, type[T]], T]:
    """The function :func:`structure_args` calls for ``cls`` (looked up once by callers that
    decode many args of one class): the fast decoding, and on failure the detailed one, whose
    error names the field."""
    fast: Callable[[Any, type[T]], T] = _fast.get_structure_hook(cls)
    detailed: Callable[[Any, type[T]], T] = _converter.get_structure_hook(cls)

    def structure(data: Any, cls: type[T]) -> T:
        try:
            return fast(data, cls)
        except Exception:
            return detailed(data, cls)

    return structure


def structure_args(data: Any, cls: type[T]) -> T:
    """Args of ``cls`` from their decoded JSON (unknown keys are ignored, as Go does)."""
    return _converter.structure(data, cls)
