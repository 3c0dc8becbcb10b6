"""Insert options: validation messages and River's precedence (no database needed)."""

from __future__ import annotations

import datetime as dt
from typing import Any, ClassVar

import attrs
import pytest

import river_anyio as river
from river_anyio._insert import build_insert_params
from river_anyio._job import JobState

UTC = dt.UTC
NOW = dt.datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)


@attrs.frozen
class Plain:
    kind: ClassVar[str] = "plain"
    n: int = 1


@attrs.frozen
class WithDefaults:
    kind: ClassVar[str] = "with_defaults"
    insert_opts: ClassVar[river.InsertOpts] = river.InsertOpts(
        queue="kind_queue",
        priority=3,
        max_attempts=7,
        tags=["from-kind"],
        metadata={"ignored": True},
        unique=river.UniqueOpts(by_queue=True),
    )
    n: int = 1


@attrs.frozen
class MethodDefaults:
    kind: ClassVar[str] = "method_defaults"
    n: int = 1

    def insert_opts(self) -> river.InsertOpts:
        return river.InsertOpts(queue=f"q{self.n}")


def build(args: object, opts: river.InsertOpts | None = None, **kw: Any):
    return build_insert_params(
        args, opts, client_max_attempts=kw.get("client_max", 25), now=lambda: NOW
    )


def test_river_defaults() -> None:
    p = build(Plain())
    assert (p.kind, p.queue, p.priority, p.max_attempts) == ("plain", "default", 1, 25)
    assert p.state is JobState.AVAILABLE
    assert p.tags == ()
    assert p.metadata == b"{}"
    assert p.encoded_args == b'{"n":1}'
    assert p.unique_key is None and p.unique_states is None
    assert p.scheduled_at is None


def test_client_default_max_attempts() -> None:
    assert build(Plain(), client_max=3).max_attempts == 3


def test_kind_defaults_apply_except_metadata_and_pending() -> None:
    p = build(WithDefaults())
    assert (p.queue, p.priority, p.max_attempts, p.tags) == ("kind_queue", 3, 7, ("from-kind",))
    assert p.metadata == b"{}"  # River reads metadata from the call site only
    assert p.unique_key is not None and p.unique_states == 0xF5


def test_call_site_beats_kind_defaults() -> None:
    p = build(
        WithDefaults(),
        river.InsertOpts(queue="site", priority=4, max_attempts=2, tags=[], metadata={"a": 1}),
    )
    assert (p.queue, p.priority, p.max_attempts, p.tags) == ("site", 4, 2, ())
    assert p.metadata == b'{"a":1}'


def test_method_insert_opts() -> None:
    assert build(MethodDefaults(n=5)).queue == "q5"


def test_scheduled_and_pending_states() -> None:
    at = dt.datetime(2030, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    p = build(Plain(), river.InsertOpts(scheduled_at=at))
    assert p.state is JobState.SCHEDULED
    assert p.scheduled_at == at and p.scheduled_at.utcoffset() == dt.timedelta(0)
    p = build(Plain(), river.InsertOpts(scheduled_at=at, pending=True))
    assert p.state is JobState.PENDING


def test_unique_from_call_site_overrides_kind() -> None:
    by_kind = build(WithDefaults())
    by_site = build(WithDefaults(), river.InsertOpts(unique=river.UniqueOpts(by_args=True)))
    assert by_kind.unique_key != by_site.unique_key
    # an empty UniqueOpts at the call site falls back to the kind's, as in River
    empty = build(WithDefaults(), river.InsertOpts(unique=river.UniqueOpts()))
    assert empty.unique_key == by_kind.unique_key
    # by_state alone makes a job unique by kind
    only_state = build(Plain(), river.InsertOpts(unique=river.UniqueOpts(by_state=[])))
    assert only_state.unique_key is not None and only_state.unique_states == 0xF5


def test_unique_period_uses_now_when_unscheduled() -> None:
    opts = river.InsertOpts(unique=river.UniqueOpts(by_period=dt.timedelta(hours=1)))
    a = build_insert_params(Plain(), opts, client_max_attempts=25, now=lambda: NOW)
    b = build_insert_params(
        Plain(), opts, client_max_attempts=25, now=lambda: NOW + dt.timedelta(minutes=30)
    )
    c = build_insert_params(
        Plain(), opts, client_max_attempts=25, now=lambda: NOW + dt.timedelta(hours=1)
    )
    assert a.unique_key == b.unique_key != c.unique_key


@pytest.mark.parametrize(
    ("make", "field", "message"),
    [
        (lambda: river.InsertOpts(priority=0), "priority", "between 1 and 4"),
        (lambda: river.InsertOpts(priority=5), "priority", "between 1 and 4"),
        (lambda: river.InsertOpts(priority=True), "priority", "must be an int"),
        (
            lambda: river.InsertOpts(max_attempts=0),
            "max_attempts",
            "between 1 and 9223372036854775807",
        ),
        (
            lambda: river.InsertOpts(max_attempts=2**63),
            "max_attempts",
            "between 1 and 9223372036854775807",
        ),
        (lambda: river.InsertOpts(queue=""), "queue", "cannot be empty"),
        (lambda: river.InsertOpts(queue="Upper"), "queue", "queue name is invalid"),
        (lambda: river.InsertOpts(queue="a" * 65), "queue", "longer than 64"),
        (lambda: river.InsertOpts(queue="has space"), "queue", "queue name is invalid"),
        (lambda: river.InsertOpts(tags="single"), "tags", "not a single string"),
        (lambda: river.InsertOpts(tags=["ok-tag", "no,commas"]), "tags[1]", "should match"),
        (lambda: river.InsertOpts(tags=["ab"]), "tags[0]", "at least 3"),
        (lambda: river.InsertOpts(tags=["x" * 256]), "tags[0]", "longer than 255"),
        (lambda: river.InsertOpts(tags=[1]), "tags[0]", "must be a str"),
        (lambda: river.InsertOpts(metadata=[1]), "metadata", "JSON object"),
        (lambda: river.InsertOpts(metadata={1: 2}), "metadata", "keys must be str"),
        (lambda: river.InsertOpts(metadata={"a": object()}), "metadata", "JSON-encodable"),
        (lambda: river.InsertOpts(metadata={"a": float("nan")}), "metadata", "JSON-encodable"),
        (
            lambda: river.InsertOpts(scheduled_at=dt.datetime(2030, 1, 1)),
            "scheduled_at",
            "timezone-aware",
        ),
        (lambda: river.InsertOpts(scheduled_at="tomorrow"), "scheduled_at", "must be a datetime"),
        (lambda: river.InsertOpts(unique="yes"), "unique", "must be a UniqueOpts"),
        (
            lambda: river.UniqueOpts(by_period=dt.timedelta(milliseconds=999)),
            "unique.by_period",
            "should not be less than 1 second",
        ),
        (
            lambda: river.UniqueOpts(by_state=["available", "bogus"]),
            "unique.by_state",
            "contains invalid state 'bogus'",
        ),
        (
            lambda: river.UniqueOpts(by_state=["available", "running"]),
            "unique.by_state",
            "missing: pending, scheduled",
        ),
        (lambda: river.UniqueOpts(by_args=[]), "unique.by_args", "empty list"),
        (
            lambda: river.UniqueOpts(exclude_kind=True),
            "unique.exclude_kind",
            "requires ByArgs, ByQueue, or ByPeriod",
        ),
        (lambda: river.UniqueOpts(by_args=["a..b"]), "unique.by_args", "dotted JSON path"),
        (lambda: river.UniqueOpts(by_args="a"), "unique.by_args", "bool or a sequence"),
    ],
)
def test_invalid_options_are_rejected_with_field_and_rule(make, field: str, message: str) -> None:
    with pytest.raises(river.ValidationError, match=message) as info:
        make()
    assert info.value.field == field


def test_invalid_args_are_rejected() -> None:
    @attrs.frozen
    class NoKind:
        n: int = 1

    @attrs.frozen
    class BadKind:
        kind: ClassVar[str] = "x"

    @attrs.frozen
    class Unencodable:
        kind: ClassVar[str] = "unencodable"
        value: object = attrs.field(factory=object)

    class NotAttrs:
        kind = "not_attrs"

    for args, message in [
        (NoKind(), "needs a `kind` class attribute"),
        (BadKind(), "should match the pattern"),
        (Unencodable(), "must encode to a JSON object"),
        (NotAttrs(), "attrs class instance"),
        ({"kind": "dict"}, "attrs class instance"),
    ]:
        with pytest.raises(river.ValidationError, match=message):
            build(args)
    with pytest.raises(river.ValidationError, match="opts: must be an InsertOpts"):
        build(Plain(), {"queue": "x"})  # type: ignore[arg-type]


def test_custom_unique_states_mask() -> None:
    opts = river.InsertOpts(
        unique=river.UniqueOpts(
            by_args=True,
            by_state=["available", "pending", "running", "scheduled", "cancelled", "discarded"],
        )
    )
    assert build(Plain(), opts).unique_states == 0b1101_1011


@attrs.define(slots=False)
class DictArgs:
    kind: ClassVar[str] = "dict_args"
    n: int = 1


def test_args_without_defaults_build_what_every_level_resolved_builds() -> None:
    """Args whose class sets no insert defaults skip resolving the levels; an explicit empty
    ``InsertOpts`` goes the long way, and both must build the same row."""
    for args in (Plain(), Plain(7), DictArgs(3)):
        assert build(args) == build(args, river.InsertOpts())
        assert build(args, client_max=4) == build(args, river.InsertOpts(), client_max=4)


def test_an_instance_insert_opts_is_honoured() -> None:
    """An instance with a ``__dict__`` may carry ``insert_opts`` of its own, even after an
    instance of its class without one was built."""
    assert build(DictArgs()).queue == "default"
    args = DictArgs()
    args.insert_opts = river.InsertOpts(queue="from_instance")  # type: ignore[attr-defined]
    assert build(args).queue == "from_instance"
