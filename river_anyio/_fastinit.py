"""Positional constructors for the hot path's slotted attrs classes.

A frozen attrs ``__init__`` sets each field through ``object.__setattr__`` (a generic
attribute lookup per field); the runtime builds several such objects per job, so for trusted
values it calls a constructor that writes the slots through their descriptors instead, about
twice as fast. A class that is not frozen gets plain assignments, which the interpreter
specializes (about four times as fast again), and no keyword or default handling. Only for
classes without validators, converters or ``__attrs_post_init__``: the values are stored as
given.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import attrs

__all__ = ["positional_constructor"]

T = TypeVar("T")


def positional_constructor(cls: type[T]) -> Callable[..., T]:
    """``make(*values)`` building a ``cls`` from every field's value, in field order."""
    fields = attrs.fields(cls)  # type: ignore[arg-type]
    if "__slots__" not in cls.__dict__ or hasattr(cls, "__attrs_post_init__"):
        raise TypeError(f"{cls.__name__}: a slotted attrs class without post-init is required")
    for f in fields:
        if f.validator is not None or f.converter is not None:
            raise TypeError(f"{cls.__name__}.{f.name} has a validator or converter")
    names = [f.name for f in fields]
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    body = []
    if cls.__setattr__ is object.__setattr__:
        # not frozen: a plain assignment writes a slot fastest (the interpreter specializes it)
        body = [f"    self.{name} = {name}\n" for name in names]
    else:
        for name in names:
            namespace[f"_set_{name}"] = getattr(cls, name).__set__
            body.append(f"    _set_{name}(self, {name})\n")
    source = (
        f"def make({', '.join(names)}):\n    self = _new(_cls)\n"
        + "".join(body)
        + "    return self\n"
    )
    exec(compile(source, f"<positional constructor of {cls.__qualname__}>", "exec"), namespace)
    make: Callable[..., T] = namespace["make"]
    return make
