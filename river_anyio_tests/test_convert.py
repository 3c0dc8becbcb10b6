"""Decoding stored args into args classes reads the names the encoder writes."""

from __future__ import annotations

import datetime as dt
import json
import uuid
from typing import ClassVar

import attrs
import cattrs
import pytest

from river_anyio._convert import structure_args, structure_hook
from river_anyio._insert import encode_args


@attrs.frozen
class Inner:
    z: int = attrs.field(metadata={"json": "Z"})


@attrs.frozen
class Renamed:
    kind: ClassVar[str] = "renamed"
    customer: str = attrs.field(metadata={"json": "customer_id"})
    inner: Inner
    plain: str = ""
    local: int = attrs.field(default=7, metadata={"json": "-"})
    note: str = attrs.field(default="", metadata={"json": "note", "omitempty": True})


def test_json_names_round_trip() -> None:
    args = Renamed(customer="c1", inner=Inner(z=3), plain="p", local=9, note="n")
    encoded = encode_args(args)
    assert encoded == b'{"customer_id":"c1","inner":{"Z":3},"plain":"p","note":"n"}'
    back = structure_args(json.loads(encoded), Renamed)
    assert back == Renamed(customer="c1", inner=Inner(z=3), plain="p", local=7, note="n")


def test_json_dash_field_is_never_read_and_missing_omitempty_keeps_default() -> None:
    data = {"customer_id": "c", "inner": {"Z": 1}, "local": 99, "customer": "ignored"}
    assert structure_args(data, Renamed) == Renamed(customer="c", inner=Inner(z=1))


@attrs.frozen
class Typed:
    at: dt.datetime
    ident: uuid.UUID
    inner: Inner
    count: int = 0


def test_the_runtimes_decoding_matches_structure_args() -> None:
    """The worker path decodes without cattrs' per-field bookkeeping: the same values for
    the same data (names as encoded, datetimes, UUIDs, nested classes)."""
    data = {
        "at": "2026-12-02T10:20:30.123456Z",
        "ident": "6f1c1a9e-2a53-4c44-9d55-8d5b4b1c2d3e",
        "inner": {"Z": 4},
        "extra": "ignored",
    }
    fast = structure_hook(Typed)
    assert fast(data, Typed) == structure_args(data, Typed)
    assert fast(data, Typed).at == dt.datetime(2026, 12, 2, 10, 20, 30, 123456, tzinfo=dt.UTC)
    renamed = {"customer_id": "c", "inner": {"Z": 1}, "local": 99}
    assert structure_hook(Renamed)(renamed, Renamed) == Renamed(customer="c", inner=Inner(z=1))


def test_the_runtimes_decoding_fails_naming_the_field() -> None:
    """Bad args fail with the detailed error structure_args gives: it names the field."""
    bad = {"at": "2026-12-02T10:20:30Z", "ident": "not-a-uuid", "inner": {"Z": 4}}
    with pytest.raises(cattrs.ClassValidationError) as fast_error:
        structure_hook(Typed)(bad, Typed)
    with pytest.raises(cattrs.ClassValidationError) as detailed_error:
        structure_args(bad, Typed)
    assert repr(fast_error.value.exceptions) == repr(detailed_error.value.exceptions)
    notes = getattr(fast_error.value.exceptions[0], "__notes__", [])
    assert any("ident" in note for note in notes), notes
