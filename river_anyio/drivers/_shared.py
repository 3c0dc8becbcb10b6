"""What the two executors share, written once: River's job list (filters, orders and keyset
cursors) over a small per-database :class:`ListDialect`, the protocol methods defined in
terms of others, and the pieces of a job row that decode alike.

Each driver keeps what its database does differently: its statements (``_queries.py``), how
values are bound and how rows are read.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Sequence
from typing import Any, Final, Protocol

import attrs

from .._errors import ValidationError
from .._fastinit import positional_constructor
from .._job import JobRow, JobState
from .._unique import unique_states_mask
from ._protocol import JobInsertParams, JobListQuery

__all__ = [
    "UNIQUE_NONCE_KEY",
    "STATE_BY_NAME",
    "ListDialect",
    "SharedOperations",
    "job_list_statement",
    "list_where",
    "make_job",
    "metadata_with_nonce",
    "refuse_repeated_unique_keys",
    "require_aware",
    "where_text",
]

#: A row's state text to its :class:`JobState` (a dict lookup: rows decode by the thousand).
STATE_BY_NAME: Final = {s.value: s for s in JobState}

#: ``make_job(*values)``: a :class:`JobRow` from its fields in order (see ``_fastinit``).
make_job: Final = positional_constructor(JobRow)


#: The metadata key of a unique insert's nonce, where the database has no other way to tell an
#: inserted row from an existing duplicate (SQLite, YugabyteDB): River's.
UNIQUE_NONCE_KEY: Final = "river:unique_nonce"


def metadata_with_nonce(metadata: str, nonce: str) -> str:
    """``metadata`` (a JSON object's text) with ``river:unique_nonce`` set, edited as text
    when that is safe."""
    text = metadata.strip()
    if UNIQUE_NONCE_KEY not in text and text.endswith("}"):
        body = text[:-1].rstrip()
        sep = "" if body.endswith("{") else ","
        return f'{body}{sep}"{UNIQUE_NONCE_KEY}":"{nonce}"}}'
    obj = json.loads(text or "{}")
    obj[UNIQUE_NONCE_KEY] = nonce
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def require_aware(value: dt.datetime, field: str) -> None:
    """Refuse a naive datetime for ``field`` (it would be read in the server's zone)."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValidationError(field, "must be timezone-aware (naive datetimes are ambiguous)")


def refuse_repeated_unique_keys(params: Sequence[JobInsertParams]) -> None:
    """Refuse a returning batch insert holding one key of River's unique index twice.

    River fails such a batch on both databases (PostgreSQL cannot make one ``ON CONFLICT``
    change a row twice; its SQLite driver checks first): which job would be the duplicate of
    which is not defined. A key counts when the job's state is one of its unique states (the
    index holds only those rows).
    """
    seen: dict[bytes, int] = {}
    for i, p in enumerate(params):
        key = p.unique_key
        if key is None or not (p.unique_states and p.unique_states & unique_states_mask([p.state])):
            continue
        first = seen.setdefault(key, i)
        if first != i:
            raise ValidationError(
                f"params[{i}].unique_key",
                f"unique key appears more than once in batch (also params[{first}])",
            )


# --- River's JobList ----------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ListDialect:
    """How one database spells the parts of a job list.

    ``member`` is a condition template with ``{column}`` and ``{type}`` (the PostgreSQL array
    element type of the column) taking one parameter, bound with ``array``; ``tags_all`` and
    ``tags_any`` take one ``array`` parameter; ``metadata_contains`` one JSON text (None: the
    database has no containment filter). ``time_column`` gives the expression a time column
    sorts and compares by.
    """

    name: str
    head: str
    placeholder: str
    member: str
    state_type: str
    array: Callable[[Sequence[Any]], Any]
    tags_all: str
    tags_any: str
    metadata_contains: str | None
    bind_int: Callable[[int], Any]
    bind_time: Callable[[dt.datetime], Any]
    time_column: Callable[[str], str]


def list_where(query: JobListQuery, d: ListDialect) -> tuple[list[str], list[Any]]:
    """The filters of a job list as conditions and their parameters (in order)."""
    if query.metadata is not None and d.metadata_contains is None:
        raise ValidationError(
            "metadata", f"JSON containment filters are supported on PostgreSQL only, not {d.name}"
        )
    states = None if query.states is None else [JobState(s).value for s in query.states]
    where: list[str] = []
    args: list[Any] = []
    for column, values, sql_type in (
        ("id", query.ids, "bigint"),
        ("kind", query.kinds, "text"),
        ("priority", query.priorities, "smallint"),
        ("queue", query.queues, "text"),
        ("state", states, d.state_type),
    ):
        if values is not None:
            where.append(d.member.format(column=column, type=sql_type))
            args.append(d.array(values))
    if query.tags_all is not None:
        where.append(d.tags_all)
        args.append(d.array(query.tags_all))
    if query.tags_any is not None:
        where.append(d.tags_any)
        args.append(d.array(query.tags_any))
    if query.metadata is not None:
        assert d.metadata_contains is not None
        where.append(d.metadata_contains)
        args.append(query.metadata.decode())
    return where, args


def where_text(where: Sequence[str]) -> str:
    """Conditions joined with AND (``true`` when there are none)."""
    return " AND ".join(where) or "true"


def job_list_statement(query: JobListQuery, d: ListDialect) -> tuple[str, list[Any]]:
    """River's JobList: the statement and its parameters for ``query``.

    Rows are ordered by the column, then id; ascending puts NULL times last and descending
    first (PostgreSQL's default, spelled out so SQLite agrees), which the cursor assumes.
    """
    where, args = list_where(query, d)
    desc = query.descending
    order = "DESC" if desc else "ASC"
    if query.order_by == "id":
        if query.after_id is not None:
            where.append(f"id {'<' if desc else '>'} {d.placeholder}")
            args.append(d.bind_int(query.after_id))
        order_by = f"id {order}"
    else:
        column = f"({d.time_column(query.order_by)})"
        where.extend(_cursor_predicate(query, column, d, args))
        order_by = f"{column} {order} NULLS {'FIRST' if desc else 'LAST'}, id {order}"
    text = d.head
    if where:
        text += " WHERE " + " AND ".join(where)
    text += f" ORDER BY {order_by} LIMIT {d.placeholder}"
    args.append(d.bind_int(query.limit))
    return text, args


def _cursor_predicate(
    query: JobListQuery, column: str, d: ListDialect, args: list[Any]
) -> list[str]:
    """River's keyset condition for resuming after the cursor row, ordered by ``column`` then
    id: with no time and a column that cannot be NULL only the id is compared; with no time
    and a nullable column the cursor row's time was NULL."""
    if query.after_id is None:
        return []
    ph = d.placeholder
    after = d.bind_int(query.after_id)
    desc = query.descending
    if query.after_time is None and not query.time_nullable:
        args.append(after)
        return [f"id {'<' if desc else '>'} {ph}"]
    if query.after_time is None:
        args.append(after)
        if desc:
            return [f"({column} IS NOT NULL OR id < {ph})"]
        return [f"({column} IS NULL AND id > {ph})"]
    at = d.bind_time(query.after_time)
    args.extend([at, at, after])
    if desc:
        return [f"({column} < {ph} OR ({column} = {ph} AND id < {ph}))"]
    or_null = f" OR {column} IS NULL" if query.time_nullable else ""
    return [f"({column} > {ph} OR ({column} = {ph} AND id > {ph}){or_null})"]


# --- protocol methods defined by others --------------------------------------------------


class _ListsJobs(Protocol):
    async def job_list_query(self, query: JobListQuery) -> list[JobRow]: ...


class SharedOperations:
    """Executor methods both drivers implement the same way, through their other methods."""

    __slots__ = ()

    async def job_list(
        self: _ListsJobs,
        *,
        ids: Sequence[int] | None = None,
        kinds: Sequence[str] | None = None,
        queues: Sequence[str] | None = None,
        states: Sequence[JobState] | None = None,
        after_id: int | None = None,
        limit: int = 100,
    ) -> list[JobRow]:
        """Jobs matching every given filter, ordered by id ascending (a :class:`JobListQuery`)."""
        return await self.job_list_query(
            JobListQuery(
                ids=None if ids is None else tuple(ids),
                kinds=None if kinds is None else tuple(kinds),
                queues=None if queues is None else tuple(queues),
                states=None if states is None else tuple(states),
                after_id=after_id,
                limit=limit,
            )
        )
