"""Attempt errors decoded as River Go decodes them: what River wrote as written, any other
valid JSON leniently (zero values, compacted JSON text), never failing a row for it."""

from __future__ import annotations

import datetime as dt

import pytest

from river_anyio._job import AttemptError
from river_anyio.drivers._decode import (
    ZERO_TIME,
    attempt_error_json,
    attempt_errors_json,
    string_list,
)

AT = dt.datetime(2024, 1, 2, 3, 4, 5, 123456, tzinfo=dt.UTC)


def err(
    *,
    at: dt.datetime = ZERO_TIME,
    attempt: int = 0,
    error: str = "",
    trace: str = "",
    at_nanosecond: int = 0,
) -> AttemptError:
    return AttemptError(
        at=at, attempt=attempt, error=error, trace=trace, at_nanosecond=at_nanosecond
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # what River writes
        (
            '{"at": "2024-01-02T03:04:05.123456Z", "attempt": 3, "error": "e", "trace": "t"}',
            err(at=AT, attempt=3, error="e", trace="t"),
        ),
        ('{"attempt": 2, "error": null}', err(attempt=2)),
        ("null", err()),
        # `at` Go's time.Time can't read: the zero time, every other field kept
        (
            '{"at": "2024-01-02 03:04:05+00", "attempt": "1", "error": "e"}',
            err(attempt=1, error="e"),
        ),
        ('{"at": "2024-01-02T03:04:05.123456", "attempt": 2}', err(attempt=2)),
        ('{"at": 1704164645, "attempt": 2}', err(attempt=2)),
        ('{"at": "2024-02-30T03:04:05Z"}', err()),
        ('{"at": "2024-01-02T03:04:05+25:00"}', err()),
        (
            '{"at": "2024-01-02T05:04:05.123456789+02:00"}',
            err(
                at=dt.datetime(
                    2024, 1, 2, 5, 4, 5, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2))
                ),
                at_nanosecond=789,
            ),
        ),
        # `attempt` leniently
        ('{"attempt": 3.0}', err(attempt=3)),
        ('{"attempt": 3.5}', err()),
        ('{"attempt": 1e2}', err(attempt=100)),
        ('{"attempt": " 4 "}', err(attempt=4)),
        ('{"attempt": "four"}', err()),
        ('{"attempt": {}}', err()),
        ('{"attempt": true}', err()),
        ('{"attempt": 9223372036854775808}', err()),
        # `error` and `trace` that are not strings: their compacted JSON
        (
            '{"attempt": 1, "error": {"message": "boom", "code": 7}, "trace": ["f1", "f 2"]}',
            err(attempt=1, error='{"message":"boom","code":7}', trace='["f1","f 2"]'),
        ),
        ('{"error": 1.50}', err(error="1.50")),
        # fields matched case-insensitively, the last repeat winning; others ignored
        ('{"Error": "a", "ERROR": "b", "extra": true}', err(error="b")),
        ('{"error": "sparse", "extra": true}', err(error="sparse")),
        # elements that are not objects: their own text
        ("42", err(error="42")),
        ('"job failed"', err(error="job failed")),
        ('[1, "two"]', err(error='[1,"two"]')),
        ("true", err(error="true")),
    ],
)
def test_attempt_error_decodes_like_river_go(text: str, expected: AttemptError) -> None:
    assert attempt_error_json(text) == expected


def test_attempt_error_that_is_not_json_raises() -> None:
    with pytest.raises(ValueError, match="Expecting value"):
        attempt_error_json('{"at":')


def test_attempt_errors_array() -> None:
    text = '[{"at": "2024-01-02T03:04:05.123456Z", "attempt": 1, "error": "e1", "trace": ""}, "e2", {"attempt": "2", "error": {"a": 1}}]'
    assert attempt_errors_json(text) == (
        err(at=AT, attempt=1, error="e1"),
        err(error="e2"),
        err(attempt=2, error='{"a":1}'),
    )
    assert attempt_errors_json("[]") == ()
    assert attempt_errors_json("null") == ()
    for bad in ('{"error": "not an array"}', "not json", '"text"', "[1,"):
        with pytest.raises(ValueError, match=r"Expecting value|cannot unmarshal"):
            attempt_errors_json(bad)


def test_string_list() -> None:
    assert string_list(["a", "b"]) == ("a", "b")
    assert string_list(None) == ()
    assert string_list([1]) is None
    assert string_list("a") is None
    assert string_list({"a": 1}) is None
