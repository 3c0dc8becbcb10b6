"""Decoding stored args into args classes reads the names the encoder writes."""

from __future__ import annotations

import json
from typing import ClassVar

import attrs

from river_anyio._convert import structure_args
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
