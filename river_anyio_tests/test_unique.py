"""Unique keys and state masks against River Go's own output (``data/unique_vectors.json``)."""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from typing import Any

import pytest

from river_anyio._gojson import encode
from river_anyio._unique import (
    DEFAULT_UNIQUE_STATES,
    DEFAULT_UNIQUE_STATES_MASK,
    JOB_STATES,
    unique_key,
    unique_key_string,
    unique_states_mask,
    validate_by_period,
    validate_unique_opts,
    validate_unique_states,
)
from river_anyio_tests.test_gojson import build_value, load_vectors

_CASES = load_vectors()["cases"]
_KEY_CASES = [case for case in _CASES if "error" not in case]
_ERROR_CASES = [case for case in _CASES if "error" in case]


def _case_id(case: dict[str, Any]) -> str:
    return str(case["name"])


def _period(case: dict[str, Any]) -> dt.timedelta | None:
    seconds = case["by_period_seconds"]
    return None if seconds is None else dt.timedelta(seconds=seconds)


def _key_kwargs(case: dict[str, Any], encoded_args: bytes) -> dict[str, Any]:
    scheduled = case["scheduled_at"]
    return {
        "kind": case["kind"],
        "encoded_args": encoded_args,
        "by_args": case["by_args"],
        "by_period": _period(case),
        "by_queue": case["by_queue"],
        "exclude_kind": case["exclude_kind"],
        "queue": case["queue"],
        "period_time": None if scheduled is None else dt.datetime.fromisoformat(scheduled),
    }


def _opts_kwargs(case: dict[str, Any]) -> dict[str, Any]:
    return {
        "by_args": case["by_args"],
        "by_period": _period(case),
        "by_queue": case["by_queue"],
        "by_state": case["by_state"],
        "exclude_kind": case["exclude_kind"],
    }


def test_corpus_is_broad() -> None:
    assert len(_KEY_CASES) >= 40
    assert any(isinstance(case["by_args"], list) for case in _KEY_CASES)
    assert any(case["unique_states"] != DEFAULT_UNIQUE_STATES_MASK for case in _KEY_CASES)


@pytest.mark.parametrize("case", _KEY_CASES, ids=_case_id)
def test_unique_key_matches_river(case: dict[str, Any]) -> None:
    go_bytes = case["go_args_json"].encode("utf-8")
    expected = bytes.fromhex(case["unique_key"])
    assert unique_key(**_key_kwargs(case, go_bytes)) == expected
    # End to end: our own encoding of the rebuilt args gives the same key.
    assert unique_key(**_key_kwargs(case, encode(build_value(case["args"])))) == expected


@pytest.mark.parametrize("case", _KEY_CASES, ids=_case_id)
def test_unique_states_match_river(case: dict[str, Any]) -> None:
    validate_unique_opts(**_opts_kwargs(case))
    states = case["by_state"] if case["by_state"] is not None else DEFAULT_UNIQUE_STATES
    assert unique_states_mask(states) == case["unique_states"]


@pytest.mark.parametrize("case", _ERROR_CASES, ids=_case_id)
def test_validation_errors_match_river(case: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(case['error'])}$"):
        validate_unique_opts(**_opts_kwargs(case))


# -- key string ---------------------------------------------------------------------

_BASE: dict[str, Any] = {
    "kind": "worker_1",
    "encoded_args": b'{"subject":"Test Email","recipient":"user@example.com"}',
    "by_args": False,
    "by_period": None,
    "by_queue": False,
    "exclude_kind": False,
    "queue": "email_queue",
}


def _key_string(**overrides: Any) -> str:
    return unique_key_string(**{**_BASE, **overrides})


def test_key_string_parts_and_hash() -> None:
    assert _key_string() == "&kind=worker_1"
    text = _key_string(by_args=True)
    assert text == '&kind=worker_1&args={"recipient":"user@example.com","subject":"Test Email"}'
    key = unique_key(**{**_BASE, "by_args": True})
    assert key == hashlib.sha256(text.encode()).digest()
    assert key.hex().startswith("924d0ae4")
    assert _key_string(by_queue=True, exclude_kind=True) == "&queue=email_queue"
    moment = dt.datetime(2024, 3, 13, 17, 42, 31, tzinfo=dt.UTC)
    assert (
        _key_string(
            by_args=["subject"], by_period=dt.timedelta(hours=1), by_queue=True, period_time=moment
        )
        == '&kind=worker_1&args={"subject":"Test Email"}&period=2024-03-13T17:00:00Z&queue=email_queue'
    )


def test_raw_values_are_copied_verbatim() -> None:
    raw = b'{ "b" : 1.50 , "a" : {"z":1,"y":[1e2, "\\u00e9"]} }'
    assert (
        _key_string(encoded_args=raw, by_args=True)
        == '&kind=worker_1&args={"a":{"z":1,"y":[1e2, "\\u00e9"]},"b":1.50}'
    )
    assert (
        _key_string(encoded_args=raw, by_args=["a.y", "b"])
        == '&kind=worker_1&args={"a":{"y":[1e2, "\\u00e9"]},"b":1.50}'
    )


def test_sorted_object_keeps_first_duplicate_and_writes_keys_like_river() -> None:
    raw = b'{"k":1,"k":2,"\\u003c":3,"\\u00e9\\u003c":4}'
    assert (
        _key_string(encoded_args=raw, by_args=True)
        == '&kind=worker_1&args={"<":3,"k":1,"é\\u003c":4}'
    )


@pytest.mark.parametrize("raw", [b"", b"[]", b"  "])
def test_sorted_object_of_nothing_is_empty_object(raw: bytes) -> None:
    assert _key_string(encoded_args=raw, by_args=True) == "&kind=worker_1&args={}"


@pytest.mark.parametrize("raw", [b"[1]", b'"s"', b"null"])
def test_sorted_object_rejects_non_objects(raw: bytes) -> None:
    with pytest.raises(ValueError, match="unique args must encode a JSON object"):
        _key_string(encoded_args=raw, by_args=True)


def test_paths_nested_sorted_and_missing() -> None:
    raw = b'{"subject":"s","addresses":{"sender":"x","recipient":"r"},"a.b":"dot"}'
    assert (
        _key_string(
            encoded_args=raw,
            by_args=["subject", "addresses.recipient", "addresses.missing", "a\\.b"],
        )
        == '&kind=worker_1&args={"a.b":"dot","addresses":{"recipient":"r"},"subject":"s"}'
    )
    assert (
        _key_string(encoded_args=raw, by_args=["nope", "subject.deeper"]) == "&kind=worker_1&args="
    )
    # Paths sharing a prefix with a sibling key that sorts between them still nest correctly.
    raw2 = b'{"a":{"y":1,"z":3},"a-b":2}'
    assert (
        _key_string(encoded_args=raw2, by_args=["a.z", "a-b", "a.y"])
        == '&kind=worker_1&args={"a-b":2,"a":{"y":1,"z":3}}'
    )


def test_numeric_path_builds_an_array_like_river() -> None:
    assert (
        _key_string(encoded_args=b'{"2":"two"}', by_args=["2"])
        == '&kind=worker_1&args=[null,null,"two"]'
    )


def test_empty_path_list_means_all_keys() -> None:
    assert _key_string(by_args=[]) == _key_string(by_args=True)


def test_by_args_string_rejected() -> None:
    with pytest.raises(TypeError, match="not a str"):
        _key_string(by_args="subject")


# -- periods --------------------------------------------------------------------------


def _bound(moment: dt.datetime, period: dt.timedelta) -> str:
    return _key_string(exclude_kind=True, by_period=period, period_time=moment).removeprefix(
        "&period="
    )


@pytest.mark.parametrize(
    ("moment", "period", "expected"),
    [
        (
            dt.datetime(2024, 3, 13, 17, 42, 31, 999999, tzinfo=dt.UTC),
            dt.timedelta(seconds=1),
            "2024-03-13T17:42:31Z",
        ),
        (
            dt.datetime(2024, 3, 13, 17, 42, 31, tzinfo=dt.UTC),
            dt.timedelta(minutes=15),
            "2024-03-13T17:30:00Z",
        ),
        (
            dt.datetime(2024, 3, 13, 17, 42, 31, tzinfo=dt.UTC),
            dt.timedelta(hours=24),
            "2024-03-13T00:00:00Z",
        ),
        # Weeks count from 0001-01-01 (a Monday), not from the Thursday Unix epoch.
        (
            dt.datetime(2024, 3, 13, 17, 42, 31, tzinfo=dt.UTC),
            dt.timedelta(days=7),
            "2024-03-11T00:00:00Z",
        ),
        (
            dt.datetime(2024, 3, 17, 23, 59, 59, tzinfo=dt.UTC),
            dt.timedelta(days=7),
            "2024-03-11T00:00:00Z",
        ),
        (dt.datetime(2024, 3, 18, tzinfo=dt.UTC), dt.timedelta(days=7), "2024-03-18T00:00:00Z"),
        (dt.datetime(1970, 1, 1, tzinfo=dt.UTC), dt.timedelta(days=7), "1969-12-29T00:00:00Z"),
        # Non-UTC input: truncated as an instant, printed in UTC.
        (
            dt.datetime(2024, 3, 10, 1, 30, tzinfo=dt.timezone(dt.timedelta(hours=5, minutes=30))),
            dt.timedelta(hours=24),
            "2024-03-09T00:00:00Z",
        ),
        (
            dt.datetime(2024, 12, 31, 20, 15, 59, tzinfo=dt.timezone(dt.timedelta(hours=-8))),
            dt.timedelta(hours=1),
            "2025-01-01T04:00:00Z",
        ),
        (
            dt.datetime(2024, 3, 13, 17, 42, 31, 700000, tzinfo=dt.UTC),
            dt.timedelta(seconds=1.5),
            "2024-03-13T17:42:31Z",
        ),
    ],
)
def test_period_truncation(moment: dt.datetime, period: dt.timedelta, expected: str) -> None:
    assert _bound(moment, period) == expected


def test_period_requires_aware_time() -> None:
    with pytest.raises(ValueError, match="period_time is required"):
        _key_string(by_period=dt.timedelta(hours=1))
    with pytest.raises(ValueError, match="timezone-aware"):
        _key_string(by_period=dt.timedelta(hours=1), period_time=dt.datetime(2024, 1, 1))
    with pytest.raises(ValueError, match="negative"):
        _key_string(
            by_period=dt.timedelta(hours=-1), period_time=dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
        )


def test_zero_period_is_disabled() -> None:
    assert _key_string(by_period=dt.timedelta(0)) == "&kind=worker_1"


# -- states and validation ------------------------------------------------------------


def test_state_bits() -> None:
    assert [unique_states_mask([state]) for state in JOB_STATES] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert unique_states_mask(DEFAULT_UNIQUE_STATES) == DEFAULT_UNIQUE_STATES_MASK == 0xF5
    assert unique_states_mask(JOB_STATES) == 0xFF
    assert unique_states_mask(["available", "pending", "running", "scheduled"]) == 0b11010001
    assert unique_states_mask([]) == 0xF5


def test_state_mask_rejects_unknown_state() -> None:
    with pytest.raises(ValueError, match='contains invalid state "bogus"'):
        unique_states_mask(["available", "bogus"])


@pytest.mark.parametrize(
    ("states", "message"),
    [
        (["available", "bogus"], 'UniqueOpts.ByState contains invalid state "bogus"'),
        (
            ["available", "completed"],
            "UniqueOpts.ByState must contain all required states, missing: pending, running, scheduled",
        ),
        (
            ["scheduled"],
            "UniqueOpts.ByState must contain all required states, missing: available, pending, running",
        ),
    ],
)
def test_validate_unique_states_errors(states: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        validate_unique_states(states)


@pytest.mark.parametrize(
    "states",
    [
        None,
        [],
        ["available", "pending", "running", "scheduled"],
        list(JOB_STATES),
        ["available", "pending", "running", "scheduled", "cancelled", "discarded"],
    ],
)
def test_validate_unique_states_accepts(states: list[str] | None) -> None:
    validate_unique_states(states)


@pytest.mark.parametrize(
    "period",
    [dt.timedelta(milliseconds=999), dt.timedelta(microseconds=1), dt.timedelta(seconds=-5)],
)
def test_validate_by_period_rejects_short(period: dt.timedelta) -> None:
    with pytest.raises(
        ValueError, match=r"^UniqueOpts\.ByPeriod should not be less than 1 second$"
    ):
        validate_by_period(period)


@pytest.mark.parametrize(
    "period", [None, dt.timedelta(0), dt.timedelta(seconds=1), dt.timedelta(days=7)]
)
def test_validate_by_period_accepts(period: dt.timedelta | None) -> None:
    validate_by_period(period)


def test_validate_unique_opts_exclude_kind_alone() -> None:
    with pytest.raises(
        ValueError, match=r"^UniqueOpts\.ExcludeKind requires ByArgs, ByQueue, or ByPeriod$"
    ):
        validate_unique_opts(exclude_kind=True)
    validate_unique_opts(exclude_kind=True, by_queue=True)
    validate_unique_opts()
