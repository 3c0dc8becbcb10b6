"""The harness's contract (River's ``conformance/protocol/protocol.go``): methods, error
codes, behaviours, and strict decoding of each method's params (unknown fields are refused,
as Go's decoder with ``DisallowUnknownFields`` refuses them)."""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable, Mapping
from typing import Any

import river_anyio as river

CODE_PARSE_ERROR = -32700
CODE_INVALID_REQUEST = -32600
CODE_METHOD_NOT_FOUND = -32601
CODE_INVALID_PARAMS = -32602
CODE_INTERNAL = -32603
CODE_NOT_FOUND = -32001
CODE_REJECTED = -32002

KIND_ECHO = "conformance_echo"
KIND_ECHO_PEER = "conformance_echo_peer"
KIND_ECHO_RENAMED = "conformance_echo_renamed"
ERROR_RETRYABLE = "conformance retryable error"
PERIODIC_JOB_ID = "conformance-periodic"
PERIODIC_MARKER_JOB_ID = "conformance-periodic-marker"


class ProtocolError(Exception):
    """A request that fails with a JSON-RPC error code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def invalid(message: str) -> ProtocolError:
    return ProtocolError(CODE_INVALID_PARAMS, message)


def not_found(message: str) -> ProtocolError:
    return ProtocolError(CODE_NOT_FOUND, message)


# --- strict params -----------------------------------------------------------------------------

Check = Callable[[str, Any], Any]


def _int(field: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise invalid(f"{field}: must be an integer, got {value!r}")
    return value


def _str(field: str, value: Any) -> str:
    if not isinstance(value, str):
        raise invalid(f"{field}: must be a string, got {value!r}")
    return value


def _bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise invalid(f"{field}: must be a boolean, got {value!r}")
    return value


def _raw(field: str, value: Any) -> Any:
    return value


def _time(field: str, value: Any) -> dt.datetime:
    text = _str(field, value)
    try:
        parsed = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise invalid(f"{field}: not an RFC 3339 time: {text!r}") from None
    if parsed.tzinfo is None:
        raise invalid(f"{field}: not an RFC 3339 time: {text!r}")
    return parsed


def _list(item: Check) -> Check:
    def check(field: str, value: Any) -> list[Any]:
        if value is None:
            return []
        if not isinstance(value, list):
            raise invalid(f"{field}: must be an array, got {value!r}")
        return [item(f"{field}[{i}]", v) for i, v in enumerate(value)]

    return check


def _optional(check: Check) -> Check:
    def inner(field: str, value: Any) -> Any:
        return None if value is None else check(field, value)

    return inner


def _object(spec: Mapping[str, Check], *, embedded: Mapping[str, Check] | None = None) -> Check:
    fields = {**(embedded or {}), **spec}

    def check(field: str, value: Any) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise invalid(f"{field or 'params'}: must be an object, got {value!r}")
        out: dict[str, Any] = {}
        for key, v in value.items():
            checker = fields.get(key)
            if checker is None:
                raise invalid(f'json: unknown field "{key}"')
            out[key] = checker(f"{field}.{key}" if field else key, v)
        return out

    return check


ARGS = {"behavior": _str, "duration_ms": _int, "message": _str}
UNIQUE = _object({
    "by_args": _bool, "by_period_ms": _int, "by_queue": _bool,
    "by_state": _list(_str), "exclude_kind": _bool,
})  # fmt: skip
INSERT_OPTS = _object({
    "max_attempts": _int, "metadata": _raw, "pending": _bool, "priority": _int,
    "queue": _str, "scheduled_at": _optional(_time), "tags": _list(_str),
    "unique": _optional(UNIQUE),
})  # fmt: skip
INSERT_JOB = _object({"opts": _optional(INSERT_OPTS)}, embedded=ARGS)
TUNING = _object(
    {"elect_interval_ms": _int, "rescuer_interval_ms": _int, "scheduler_interval_ms": _int}
)

# fmt: off
PARAMS: dict[str, Check] = {
    "cancel": _object({"id": _int, "schema": _str, "tx": _str}),
    "handshake": _object({}),
    "insert": _object({"jobs": _list(INSERT_JOB), "schema": _str, "tx": _str}),
    "list": _object({
        "after": _str, "direction": _str, "ids": _list(_int), "kinds": _list(_str),
        "limit": _int, "metadata": _raw, "order_by": _str, "priorities": _list(_int),
        "queues": _list(_str), "schema": _str, "states": _list(_str),
        "tags_all": _list(_str), "tx": _str,
    }),
    "migrate": _object(
        {"direction": _str, "schema": _str, "target_version": _optional(_int)}
    ),
    "queue": _object(
        {"action": _str, "metadata": _raw, "name": _str, "schema": _str, "tx": _str}
    ),
    "release": _object({"name": _str}),
    "request_resign": _object({"schema": _str, "tx": _str}),
    "retry": _object({"id": _int, "schema": _str, "tx": _str}),
    "start": _object({
        "claim_barrier": _str, "client_id": _str, "error_handler_cancel": _bool,
        "fetch_only_known_kinds": _bool, "fetch_poll_interval_ms": _int,
        "job_timeout_ms": _int, "leader_election_disabled": _bool, "max_workers": _int,
        "periodic_run_on_start": _bool, "periodic_unique": _bool, "poll_only": _bool,
        "queues": _list(_str), "rescue_after_ms": _int, "retry_delay_ms": _int,
        "schema": _str, "tuning": _optional(TUNING), "worker_kinds": _list(_str),
    }),
    "stats": _object({}),
    "stop": _object({"cancel": _bool}),
    "tx_begin": _object({"tx": _str}),
    "tx_end": _object({"commit": _bool, "tx": _str}),
}
# fmt: on


def decode_params(method: str, raw: Any) -> dict[str, Any]:
    """``raw`` checked against ``method``'s params: a dict of the fields given."""
    check = PARAMS.get(method)
    if check is None:
        raise ProtocolError(CODE_METHOD_NOT_FOUND, f"unknown method {method!r}")
    result: dict[str, Any] = check("", raw)
    return result


# --- jobs as the contract reports them ---------------------------------------------------------


def format_rfc3339nano(value: dt.datetime, nanosecond: int = 0) -> str:
    """UTC ``value`` as Go marshals a ``time.Time`` (RFC 3339, the fraction's trailing zeros
    trimmed), with ``nanosecond`` (0-999) past its microseconds."""
    utc = value.astimezone(dt.UTC)
    frac = f"{utc.microsecond:06d}{nanosecond:03d}".rstrip("0")
    return utc.replace(tzinfo=None).isoformat("T", "seconds") + (f".{frac}" if frac else "") + "Z"


def _time_text(value: dt.datetime | None) -> str | None:
    return None if value is None else format_rfc3339nano(value.astimezone(dt.UTC))


#: What a number beyond float range (decoded as an infinite float) is reported as: still a
#: number beyond float64's range, as stored, where ``Infinity`` would not be valid JSON.
_BEYOND_FLOAT = 10**400


def _json_numbers(value: Any) -> Any:
    """``value`` with every non-finite float replaced by a JSON number (NaN, which no JSON
    document holds, by null)."""
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return None if math.isnan(value) else (_BEYOND_FLOAT if value > 0 else -_BEYOND_FLOAT)
    if isinstance(value, Mapping):
        return {k: _json_numbers(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_numbers(v) for v in value]
    return value


def job_json(row: river.JobRow) -> dict[str, Any]:
    """A job row in the contract's form (``protocol.Job``); numbers as valid JSON."""
    metadata = {k: _json_numbers(v) for k, v in row.metadata.items() if k != "river:unique_nonce"}
    return {
        "args": _json_numbers(dict(row.args)),
        "attempt": row.attempt,
        "attempted_at": _time_text(row.attempted_at),
        "attempted_by": list(row.attempted_by),
        "created_at": _time_text(row.created_at),
        "errors": [
            {
                "at": format_rfc3339nano(e.at.astimezone(dt.UTC), e.at_nanosecond),
                "attempt": e.attempt,
                "error": e.error,
                "trace": e.trace,
            }
            for e in row.errors
        ],
        "finalized_at": _time_text(row.finalized_at),
        "id": row.id,
        "kind": row.kind,
        "max_attempts": row.max_attempts,
        "metadata": metadata,
        "priority": row.priority,
        "queue": row.queue,
        "scheduled_at": _time_text(row.scheduled_at),
        "state": str(row.state.value),
        "tags": list(row.tags),
        "unique_key": None if row.unique_key is None else row.unique_key.hex(),
        "unique_states": (
            None if row.unique_states is None else sorted(s.value for s in row.unique_states)
        ),
    }
