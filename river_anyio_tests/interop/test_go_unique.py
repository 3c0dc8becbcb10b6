"""Unique jobs across languages: for a corpus of args and unique options, River Go and
river_anyio compute the same unique key and state mask, and a duplicate inserted from the
other language is skipped (the first language's job is returned)."""

from __future__ import annotations

import datetime as dt
import itertools
from typing import Any, ClassVar

import attrs
import pytest

import river_anyio as river
from river_anyio._insert import build_insert_params

from ._river_go import RiverGo
from ._shared import Plain

pytestmark = pytest.mark.anyio


@attrs.frozen
class Order:
    """The Go program's ``OrderArgs``; ``river:"unique"`` on customer_id and amount."""

    kind: ClassVar[str] = "interop_order"
    customer_id: str
    trace_id: str
    amount: float


@attrs.frozen
class Address:
    city: str
    zip: str


@attrs.frozen
class Mail:
    """The Go program's ``MailArgs``; ``river:"unique"`` on subject, to.city and urgent."""

    kind: ClassVar[str] = "interop_mail"
    subject: str
    to: Address
    body: str
    urgent: bool = attrs.field(default=False, metadata={"omitempty": True})


@attrs.frozen
class Empty:
    kind: ClassVar[str] = "interop_empty"


# (Go type, Python class, args as JSON, the Python form of the Go unique tags)
ARGS: dict[str, tuple[str, type, dict[str, Any], tuple[str, ...] | None]] = {
    "plain": ("plain", Plain, {"name": "a", "count": 1, "ratio": 0.5, "tags": ["x"],
                               "meta": {"b": 1, "a": [2, {"d": None, "c": True}]}}, None),
    "plain_quirky": ("plain", Plain, {"name": "<é&\u2028>\"", "count": -(2**62), "ratio": 1e21,
                                      "tags": [], "meta": {"é": 1, "e": -0.0},
                                      "note": "present"}, None),
    "plain_nulls": ("plain", Plain, {"name": "", "count": 0, "ratio": 0.0, "tags": None,
                                     "meta": None}, None),
    "order": ("order", Order, {"customer_id": "c1", "trace_id": "t1", "amount": 9.99},
              ("customer_id", "amount")),
    "order_other_trace": ("order", Order, {"customer_id": "c1", "trace_id": "t2",
                                           "amount": 9.99}, ("customer_id", "amount")),
    "mail": ("mail", Mail, {"subject": "hi", "to": {"city": "Paris", "zip": "75001"},
                            "body": "b"}, ("subject", "to.city", "urgent")),
    "mail_urgent": ("mail", Mail, {"subject": "hi", "to": {"city": "Paris", "zip": "1"},
                                   "body": "other", "urgent": True},
                    ("subject", "to.city", "urgent")),
    "empty": ("empty", Empty, {}, None),
}  # fmt: skip

AT = dt.datetime(2031, 5, 6, 7, 8, 9, 123456, tzinfo=dt.UTC)
ALL_STATES = [s.value for s in river.JobState]
CUSTOM_STATES = ["available", "pending", "running", "scheduled", "completed"]

# name -> (UniqueOpts fields as JSON, extra insert options)
OPTS: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "args": ({"by_args": True}, {}),
    "args_queue": ({"by_args": True, "by_queue": True}, {}),
    "queue": ({"by_queue": True}, {}),
    "period": ({"by_period_seconds": 3600}, {"scheduled_at": AT}),
    "args_period": ({"by_args": True, "by_period_seconds": 900}, {"scheduled_at": AT}),
    "args_no_kind": ({"by_args": True, "exclude_kind": True}, {}),
    "args_states": ({"by_args": True, "by_state": CUSTOM_STATES}, {}),
    "args_all_states": ({"by_args": True, "by_state": ALL_STATES}, {}),
    "queue_no_kind": ({"by_queue": True, "exclude_kind": True}, {}),
    "everything": ({"by_args": True, "by_queue": True, "by_period_seconds": 60,
                    "exclude_kind": True}, {"scheduled_at": AT}),
    "by_state_only": ({"by_state": ALL_STATES}, {}),
}  # fmt: skip

CASES = [
    *(("plain", o) for o in OPTS),
    *(("plain_quirky", o) for o in ("args", "args_queue", "args_no_kind", "args_states")),
    *(("plain_nulls", o) for o in ("args", "period")),
    *(("order", o) for o in ("args", "args_queue", "args_period", "args_no_kind")),
    ("order_other_trace", "args"),  # same unique fields as ("order", "args"): a duplicate
    *(("mail", o) for o in ("args", "args_no_kind", "everything")),
    *(("mail_urgent", o) for o in ("args", "args_states")),
    *(("empty", o) for o in ("args", "queue", "period")),
]
assert len(CASES) >= 30


def case_kind_queue(index: int, args_name: str, opts_name: str) -> tuple[str, str]:
    """Each case gets its own kind and queue, so cases only collide where they are meant to
    (the kind is left out by exclude_kind, the queue unless by_queue)."""
    if args_name == "order_other_trace":
        index = CASES.index(("order", "args"))
    return f"uq_{index:02d}_{ARGS[args_name][0]}", f"uq_q{index:02d}"


def go_spec(index: int, args_name: str, opts_name: str) -> dict[str, Any]:
    typ, _cls, args, _tags = ARGS[args_name]
    unique, extra = OPTS[opts_name]
    kind, queue = case_kind_queue(index, args_name, opts_name)
    spec: dict[str, Any] = {"type": typ, "kind": kind, "queue": queue, "args": args}
    spec["unique"] = unique
    if "scheduled_at" in extra:
        spec["scheduled_at"] = extra["scheduled_at"].isoformat().replace("+00:00", "Z")
    return spec


def py_insert(index: int, args_name: str, opts_name: str) -> tuple[object, river.InsertOpts]:
    _typ, cls, args, tags = ARGS[args_name]
    unique, extra = OPTS[opts_name]
    kind, queue = case_kind_queue(index, args_name, opts_name)
    sub = type(f"{cls.__name__}_{index}", (cls,), {"kind": kind})
    values = dict(args)
    if cls is Mail:
        values["to"] = Address(**values["to"])
    by_args: bool | tuple[str, ...] = unique.get("by_args", False)
    if by_args and tags:
        by_args = tags
    opts = river.InsertOpts(
        queue=queue,
        scheduled_at=extra.get("scheduled_at"),
        unique=river.UniqueOpts(
            by_args=by_args,
            by_period=(
                dt.timedelta(seconds=unique["by_period_seconds"])
                if "by_period_seconds" in unique
                else None
            ),
            by_queue=unique.get("by_queue", False),
            by_state=unique.get("by_state"),
            exclude_kind=unique.get("exclude_kind", False),
        ),
    )
    return sub(**values), opts


def ours(index: int, args_name: str, opts_name: str) -> tuple[str, list[str]]:
    """river_anyio's key (hex) and unique states for a case, computed without a database."""
    args, opts = py_insert(index, args_name, opts_name)
    params = build_insert_params(args, opts, client_max_attempts=25, now=lambda: AT)
    assert params.unique_key is not None and params.unique_states is not None
    states = [s for i, s in enumerate(sorted(ALL_STATES)) if params.unique_states & (1 << i)]
    return params.unique_key.hex(), states


@pytest.mark.parametrize("first", ["go", "river_anyio"])
async def test_same_unique_keys_and_duplicates_skipped_across_languages(
    river_go: RiverGo, database_url: str, first: str
) -> None:
    url = database_url
    specs = [go_spec(i, a, o) for i, (a, o) in enumerate(CASES)]
    async with river.open_client(url) as run:
        if first == "go":
            go_results = await river_go.call("insert", url, stdin=specs)
            py_results = [await run.client.insert(*py_insert(i, *c)) for i, c in enumerate(CASES)]
        else:
            py_results = [await run.client.insert(*py_insert(i, *c)) for i, c in enumerate(CASES)]
            go_results = await river_go.call("insert", url, stdin=specs)

    duplicate = CASES.index(("order_other_trace", "args"))
    for i, (case, go, py) in enumerate(zip(CASES, go_results, py_results, strict=True)):
        key, states = ours(i, *case)
        assert go["row"]["unique_key"] == key, case
        assert sorted(go["row"]["unique_states"]) == states, case
        assert py.job.unique_key is not None and py.job.unique_key.hex() == key, case
        assert go["id"] == py.job.id, case
        # the second language's insert is the one skipped (and the in-corpus duplicate, always)
        assert go["skipped"] == (first == "river_anyio" or i == duplicate), case
        assert py.unique_skipped_as_duplicate == (first == "go" or i == duplicate), case
    assert len({r["row"]["unique_key"] for r in go_results}) == len(CASES) - 1


def test_corpus_exercises_every_option() -> None:
    used = {o for _a, o in CASES}
    assert used == set(OPTS)
    assert {a for a, _o in CASES} == set(ARGS)
    assert len(list(itertools.chain(CASES))) >= 30
