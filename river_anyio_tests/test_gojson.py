"""Go ``encoding/json`` compatibility of ``river_anyio._gojson``.

The tables in ``data/unique_vectors.json`` come from River Go and Go's own
``json.Marshal`` (see ``interop/unique_vectors``); the focused cases below pin
the rules those tables exercise.
"""

from __future__ import annotations

import base64
import datetime as dt
import enum
import functools
import itertools
import json
import struct
import uuid
from decimal import Decimal
from pathlib import Path
from typing import Any

import attrs
import pytest

from river_anyio._gojson import MAX_DEPTH, encode, format_float, format_time

VECTORS_PATH = Path(__file__).parent / "data" / "unique_vectors.json"


@functools.cache
def load_vectors() -> dict[str, Any]:
    """The Go-generated vector file."""
    data: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
    return data


_class_ids = itertools.count()


def go_str(b64: str) -> str:
    """A Go string's bytes as a Python str (invalid bytes become lone surrogates)."""
    return base64.b64decode(b64).decode("utf-8", "surrogateescape")


def build_value(node: dict[str, Any]) -> Any:
    """Rebuild the Python equivalent of a described Go value.

    Structs become instances of fresh attrs classes with fields in Go's declaration
    order (``json`` / ``omitempty`` in field metadata); maps become dicts in a
    deliberately unsorted order.
    """
    kind = node["t"]
    if kind == "struct":
        fields = {
            f["name"]: attrs.field(metadata={"json": f["json"], "omitempty": f["omitempty"]})
            for f in node["fields"]
        }
        cls = attrs.make_class(f"GoStruct{next(_class_ids)}", fields)
        return cls(**{f["name"]: build_value(f["value"]) for f in node["fields"]})
    if kind == "map":
        return {go_str(item["k_b64"]): build_value(item["v"]) for item in node["items"]}
    if kind == "list":
        return [build_value(item) for item in node["items"]]
    if kind == "str":
        return go_str(node["b64"])
    if kind == "int":
        return int(node["v"])
    if kind == "float":
        return float(node["v"])
    if kind == "bool":
        return bool(node["v"])
    if kind == "null":
        return None
    if kind == "bytes":
        return base64.b64decode(node["b64"])
    if kind == "time":
        return go_time(node["unix_us"], node["offset_seconds"])
    raise AssertionError(f"unknown node type {kind}")


def go_time(unix_us: int, offset_seconds: int) -> dt.datetime:
    """An aware datetime for a Go time given as Unix microseconds and zone offset."""
    utc = dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(microseconds=unix_us)
    return utc.astimezone(dt.timezone(dt.timedelta(seconds=offset_seconds)))


def _case_id(case: dict[str, Any]) -> str:
    return str(case["name"])


# -- tables from Go -----------------------------------------------------------------


@pytest.mark.parametrize("case", load_vectors()["cases"], ids=_case_id)
def test_args_match_go_marshal(case: dict[str, Any]) -> None:
    assert encode(build_value(case["args"])) == case["go_args_json"].encode("utf-8")


def test_float_table_matches_go() -> None:
    cases = load_vectors()["float_cases"]
    assert len(cases) > 500
    mismatches = []
    for case in cases:
        value = struct.unpack(">d", bytes.fromhex(case["bits"]))[0]
        if encode(value) != case["json"].encode():
            mismatches.append((value, encode(value), case["json"]))
    assert mismatches == []


def test_string_table_matches_go() -> None:
    cases = load_vectors()["string_cases"]
    assert any(case["json"] == '"\\ufffd"' for case in cases)
    for case in cases:
        assert encode(go_str(case["b64"])) == case["json"].encode("utf-8"), case


def test_time_table_matches_go() -> None:
    cases = load_vectors()["time_cases"]
    assert cases
    for case in cases:
        value = go_time(case["unix_us"], case["offset_seconds"])
        assert encode(value) == case["json"].encode(), case


# -- floats ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (1.0, "1"),
        (-1.0, "-1"),
        (0.0, "0"),
        (-0.0, "-0"),
        (0.1, "0.1"),
        (1.5, "1.5"),
        (1e20, "100000000000000000000"),
        (1e21, "1e+21"),
        (1.5e300, "1.5e+300"),
        (1e-6, "0.000001"),
        (1.5e-5, "0.000015"),
        (1e-7, "1e-7"),
        (-2.5e-9, "-2.5e-9"),
        (1e-10, "1e-10"),
        (5e-324, "5e-324"),
        (float(2**60), "1152921504606847000"),
        (1e16, "10000000000000000"),
        (123456789.125, "123456789.125"),
    ],
)
def test_float_format(value: float, expected: str) -> None:
    assert format_float(value) == expected
    assert encode(value) == expected.encode()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_rejected(value: float) -> None:
    with pytest.raises(ValueError, match="unsupported value"):
        encode({"a": [value]})


def test_integers_are_exact_and_bools_are_bools() -> None:
    assert (
        encode([2**64 - 1, -(2**63), 0, True, False])
        == b"[18446744073709551615,-9223372036854775808,0,true,false]"
    )


# -- strings --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("<a&b>", r'"\u003ca\u0026b\u003e"'),
        ("\u2028\u2029", r'"\u2028\u2029"'),
        ("\b\f\n\r\t", r'"\b\f\n\r\t"'),
        ("\x00\x01\x0b\x1f", r'"\u0000\u0001\u000b\u001f"'),
        ("\x7f", '"\x7f"'),
        ('"\\/', r'"\"\\/"'),
        ("é😀", '"é😀"'),
        ("bad\udcffbyte", r'"bad\ufffdbyte"'),
        ("\ud800", r'"\ufffd"'),
    ],
)
def test_string_escaping(value: str, expected: str) -> None:
    assert encode(value) == expected.encode("utf-8")


def test_html_escaping_applies_to_keys_too() -> None:
    assert encode({"<k>": "v&"}) == b'{"\\u003ck\\u003e":"v\\u0026"}'


# -- containers, structs, ordering ----------------------------------------------------


@attrs.define
class _Inner:
    zed: int
    alpha: str


@attrs.define
class _Outer:
    zulu: str = attrs.field(metadata={"json": "z_name"})
    inner: _Inner = attrs.field(factory=lambda: _Inner(1, "a"))
    mapping: dict[str, int] = attrs.field(factory=dict)
    skipped: str = attrs.field(default="x", metadata={"json": "-"})
    maybe: list[int] | None = attrs.field(default=None, metadata={"omitempty": True})


def test_struct_order_is_declaration_order_and_maps_are_sorted() -> None:
    value = _Outer("z", _Inner(2, "b"), {"b": 1, "a": 2, "é": 3, "Z": 4})
    assert (
        encode(value)
        == b'{"z_name":"z","inner":{"zed":2,"alpha":"b"},"mapping":{"Z":4,"a":2,"b":1,"\xc3\xa9":3}}'
    )


def test_map_keys_sort_by_utf8_bytes() -> None:
    keys = ["\uffff", "\U0001f600", "\u00e9", "z"]
    assert encode(dict.fromkeys(keys, 0)) == '{"z":0,"é":0,"\uffff":0,"😀":0}'.encode()


@pytest.mark.parametrize(
    ("maybe", "expected_tail"),
    [
        (None, b""),
        ([], b""),
        ([0], b',"maybe":[0]'),
    ],
)
def test_omitempty(maybe: list[int] | None, expected_tail: bytes) -> None:
    encoded = encode(_Outer("z", maybe=maybe))
    assert encoded.endswith(b'"mapping":{}' + expected_tail + b"}")


@attrs.define
class _AllEmpty:
    a: Any = attrs.field(metadata={"omitempty": True})


@pytest.mark.parametrize("value", [None, False, 0, 0.0, -0.0, "", [], (), {}, b""])
def test_omitempty_go_empty_values(value: Any) -> None:
    assert encode(_AllEmpty(value)) == b"{}"


@pytest.mark.parametrize("value", [True, 1, 0.5, " ", [0], {"": 0}, b"\x00", _Inner(0, "")])
def test_omitempty_keeps_non_empty_values(value: Any) -> None:
    assert encode(_AllEmpty(value)) != b"{}"


class _Color(enum.Enum):
    RED = "red"
    ONE = 1


def test_other_supported_types() -> None:
    value = {
        "e": [_Color.RED, _Color.ONE],
        "u": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "b": b"hello\x00\xff",
        "t": dt.datetime(
            2024, 3, 13, 17, 42, 31, 120000, tzinfo=dt.timezone(dt.timedelta(hours=-8))
        ),
        "tu": (
            dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
            dt.datetime(2024, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC),
        ),
    }
    assert encode(value) == (
        b'{"b":"aGVsbG8A/w==","e":["red",1],"t":"2024-03-13T17:42:31.12-08:00",'
        b'"tu":["2024-01-01T00:00:00Z","2024-01-01T00:00:00.000001Z"],'
        b'"u":"12345678-1234-5678-1234-567812345678"}'
    )


def test_format_time_truncates_offset_seconds_like_go() -> None:
    moment = dt.datetime(2001, 2, 3, 4, 5, 6, tzinfo=dt.timezone(dt.timedelta(seconds=-59)))
    assert format_time(moment) == "2001-02-03T04:05:06+00:00"


def test_naive_datetime_rejected() -> None:
    with pytest.raises(ValueError, match="naive datetime"):
        encode({"at": dt.datetime(2024, 1, 1)})


@pytest.mark.parametrize(
    ("value", "path", "type_name"),
    [
        ({"a": [1, Decimal("1.5")]}, "$['a'][1]", "Decimal"),
        ([dt.date(2024, 1, 1)], "$[0]", "date"),
        ({"s": {1, 2}}, "$['s']", "set"),
        (_Outer("z", mapping={"k": object()}), "$.mapping['k']", "object"),  # type: ignore[dict-item]
    ],
)
def test_unsupported_types_name_the_path(value: Any, path: str, type_name: str) -> None:
    with pytest.raises(TypeError) as excinfo:
        encode(value)
    assert str(excinfo.value) == f"cannot encode {type_name} as Go JSON at {path}"


def test_non_str_map_keys_rejected() -> None:
    with pytest.raises(TypeError, match=r"map key 1 is not a str at \$\['outer'\]"):
        encode({"outer": {1: "x"}})


def test_depth_limit() -> None:
    ok: Any = []
    for _ in range(MAX_DEPTH - 1):
        ok = [ok]
    assert encode(ok).startswith(b"[[")
    too_deep: Any = [ok]
    too_deep = [too_deep]
    with pytest.raises(ValueError, match="nesting deeper than"):
        encode(too_deep)
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="nesting deeper than"):
        encode(cyclic)
