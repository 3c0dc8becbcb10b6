from __future__ import annotations

import datetime as dt

import attrs
import pytest

from river_anyio._fastinit import positional_constructor
from river_anyio._job import JobRow, JobState


def test_builds_the_same_object_as_init() -> None:
    now = dt.datetime.now(dt.UTC)
    values = {
        "id": 7,
        "args": {"n": 1},
        "encoded_args": b'{"n":1}',
        "attempt": 1,
        "attempted_at": now,
        "attempted_by": ("client",),
        "created_at": now,
        "errors": (),
        "finalized_at": None,
        "kind": "k",
        "max_attempts": 25,
        "metadata": {},
        "priority": 1,
        "queue": "default",
        "scheduled_at": now,
        "state": JobState.RUNNING,
        "tags": ("a",),
        "unique_key": None,
        "unique_states": None,
    }
    fast = positional_constructor(JobRow)(*(values[f.name] for f in attrs.fields(JobRow)))
    assert fast == JobRow(**values)
    assert type(fast) is JobRow
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        fast.id = 8  # type: ignore[misc]


def test_a_class_that_is_not_frozen_gets_the_same_object_as_init() -> None:
    @attrs.define(kw_only=True)
    class Record:
        a: int
        b: str = "default"
        c: list[int] = attrs.field(factory=list)

    fast = positional_constructor(Record)(1, "b", [2])
    assert fast == Record(a=1, b="b", c=[2])
    assert type(fast) is Record
    fast.a = 3  # still a mutable record
    assert fast.a == 3


def test_rejects_classes_it_would_get_wrong() -> None:
    @attrs.frozen
    class Validated:
        x: int = attrs.field(validator=attrs.validators.instance_of(int))

    @attrs.frozen(slots=False)
    class Unslotted:
        x: int

    @attrs.frozen
    class PostInit:
        x: int

        def __attrs_post_init__(self) -> None:
            pass

    with pytest.raises(TypeError, match="validator"):
        positional_constructor(Validated)
    for cls in (Unslotted, PostInit):
        with pytest.raises(TypeError, match="slotted"):
            positional_constructor(cls)
