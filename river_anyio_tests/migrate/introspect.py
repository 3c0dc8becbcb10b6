"""Deterministic, JSON-serialisable descriptions of River's schema objects.

The migration tests compare what our SQL files build with what River Go builds, version by
version, on PostgreSQL and SQLite. Both functions here read only the catalogue (plus the
``(line, version)`` list of ``river_migration``) and return plain dicts/lists/scalars, so two
databases have the same schema exactly when their descriptions compare equal.

Normalisation is limited to things that do not change behaviour:

* the schema name is removed (objects are described relative to the schema asked for);
* text we have to parse ourselves (function bodies, SQLite ``CHECK``/``WHERE``/default
  expressions) is reduced to a canonical token stream: comments and layout dropped,
  unquoted words lower-cased, string literals kept verbatim;
* Postgres column positions are counted over live columns only, so a dropped column's hole
  in ``attnum`` does not show up;
* Postgres NOT NULL constraints are described on the columns only (PostgreSQL 18 also lists
  them in ``pg_constraint``, which would make the output depend on the server version).

``describe_postgres`` changes ``search_path`` while it reads and restores it afterwards; on a
connection that is not in autocommit mode this happens inside the caller's transaction.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import apsw
import psycopg
from psycopg import sql

__all__ = ["canonical_sql", "describe_postgres", "describe_sqlite", "sql_tokens"]

Description = dict[str, Any]
_Norm = Callable[[str | None], str | None]

_TOKEN_RE = re.compile(
    r"""
    (?P<space>\s+)
  | (?P<line_comment>--[^\n]*)
  | (?P<block_comment>/\*.*?\*/)
  | (?P<string>'(?:[^']|'')*')
  | (?P<quoted>"(?:[^"]|"")*"|`(?:[^`]|``)*`|\[[^\]]*\])
  | (?P<number>\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)
  | (?P<word>[A-Za-z_][A-Za-z0-9_$]*)
  | (?P<op>::|<<|>>|<=|>=|<>|!=|==|\|\||->>|->|.)
    """,
    re.VERBOSE | re.DOTALL,
)
_PLAIN_IDENT_RE = re.compile(r"[a-z_][a-z0-9_]*")


def sql_tokens(text: str) -> list[str]:
    """Split SQL into tokens, dropping whitespace and comments.

    Unquoted words are lower-cased (keywords and identifiers are case-insensitive in both
    databases); quoted identifiers that are plain lower-case names lose their quotes; string
    literals are kept as written.
    """
    tokens: list[str] = []
    for match in _TOKEN_RE.finditer(text):
        kind = match.lastgroup
        value = match.group()
        if kind in ("space", "line_comment", "block_comment"):
            continue
        if kind == "word":
            value = value.lower()
        elif kind == "quoted":
            inner = value[1:-1]
            if _PLAIN_IDENT_RE.fullmatch(inner):
                value = inner
        tokens.append(value)
    return tokens


def _join_tokens(tokens: list[str]) -> str:
    """Join tokens with single spaces, without spaces inside parentheses or before commas."""
    out: list[str] = []
    for token in tokens:
        if out and out[-1] != "(" and token not in (")", ","):
            out.append(" ")
        out.append(token)
    return "".join(out)


def canonical_sql(text: str | None) -> str | None:
    """Return a layout-independent form of a SQL fragment (None stays None)."""
    if text is None:
        return None
    return _join_tokens(sql_tokens(text))


def _schema_stripper(schema: str) -> re.Pattern[str]:
    """Match ``schema.`` and ``"schema".`` prefixes so they can be removed from catalogue text."""
    quoted = '"' + schema.replace('"', '""') + '"'
    return re.compile(r'(?<![\w"])(?:' + re.escape(quoted) + "|" + re.escape(schema) + r")\.")


# ---------------------------------------------------------------------------------------------
# PostgreSQL
# ---------------------------------------------------------------------------------------------

_PG_PERSISTENCE = {"p": "logged", "u": "unlogged", "t": "temporary"}
_PG_VOLATILITY = {"i": "immutable", "s": "stable", "v": "volatile"}


def describe_postgres(conn: psycopg.Connection[Any], schema: str) -> Description:
    """Describe River's objects in one Postgres schema.

    The search path is pointed at ``schema`` while reading so that catalogue functions print
    names unqualified; it is restored afterwards.
    """
    nsp_row = conn.execute("SELECT oid FROM pg_namespace WHERE nspname = %s", [schema]).fetchone()
    if nsp_row is None:
        raise ValueError(f"schema {schema!r} does not exist")
    nsp: int = nsp_row[0]
    strip = _schema_stripper(schema)

    def norm(text: str | None) -> str | None:
        return None if text is None else strip.sub("", text)

    saved_row = conn.execute("SELECT current_setting('search_path')").fetchone()
    assert saved_row is not None
    conn.execute(
        "SELECT set_config('search_path', quote_ident(%s) || ', pg_catalog', false)", [schema]
    )
    try:
        return {
            "tables": _pg_tables(conn, nsp, norm),
            "enums": _pg_enums(conn, nsp),
            "functions": _pg_functions(conn, nsp, norm),
            "sequences": _pg_sequences(conn, nsp, norm),
            "river_migration": _pg_migration_rows(conn, nsp, schema),
        }
    finally:
        conn.execute("SELECT set_config('search_path', %s, false)", [saved_row[0]])


def _pg_tables(conn: psycopg.Connection[Any], nsp: int, norm: _Norm) -> dict[str, Any]:
    """Tables (and any views) with their columns, constraints, indexes and triggers."""
    tables: dict[str, Any] = {}
    rels = conn.execute(
        """
        SELECT c.oid, c.relname, c.relkind, c.relpersistence, c.reloptions
        FROM pg_class AS c
        WHERE c.relnamespace = %s AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
        ORDER BY c.relname
        """,
        [nsp],
    ).fetchall()
    for oid, name, relkind, persistence, reloptions in rels:
        columns = [
            {
                "name": col_name,
                "position": position,
                "type": norm(col_type),
                "not_null": bool(not_null),
                "default": norm(default),
                "identity": identity or None,
                "generated": generated or None,
            }
            for col_name, position, col_type, not_null, default, identity, generated in conn.execute(
                """
                SELECT a.attname,
                       row_number() OVER (ORDER BY a.attnum),
                       format_type(a.atttypid, a.atttypmod),
                       a.attnotnull,
                       pg_get_expr(d.adbin, d.adrelid),
                       a.attidentity,
                       a.attgenerated
                FROM pg_attribute AS a
                LEFT JOIN pg_attrdef AS d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
                ORDER BY a.attnum
                """,
                [oid],
            )
        ]
        constraints = [
            {"name": con_name, "type": con_type, "definition": norm(definition)}
            for con_name, con_type, definition in conn.execute(
                """
                SELECT conname, contype, pg_get_constraintdef(oid)
                FROM pg_constraint
                WHERE conrelid = %s AND contype <> 'n'
                ORDER BY conname, contype
                """,
                [oid],
            )
        ]
        indexes = [
            {
                "name": idx_name,
                "definition": norm(definition),
                "primary": bool(primary),
                "unique": bool(unique),
            }
            for idx_name, definition, primary, unique in conn.execute(
                """
                SELECT ic.relname, pg_get_indexdef(i.indexrelid), i.indisprimary, i.indisunique
                FROM pg_index AS i
                JOIN pg_class AS ic ON ic.oid = i.indexrelid
                WHERE i.indrelid = %s
                ORDER BY ic.relname
                """,
                [oid],
            )
        ]
        triggers = [
            {"name": trg_name, "definition": norm(definition)}
            for trg_name, definition in conn.execute(
                """
                SELECT tgname, pg_get_triggerdef(oid)
                FROM pg_trigger
                WHERE tgrelid = %s AND NOT tgisinternal
                ORDER BY tgname
                """,
                [oid],
            )
        ]
        tables[name] = {
            "kind": relkind,
            "persistence": _PG_PERSISTENCE.get(persistence, persistence),
            "options": sorted(reloptions) if reloptions else None,
            "columns": columns,
            "constraints": constraints,
            "indexes": indexes,
            "triggers": triggers,
        }
    return tables


def _pg_enums(conn: psycopg.Connection[Any], nsp: int) -> dict[str, list[str]]:
    """Enum types with their labels in sort order."""
    return {
        type_name: list(labels)
        for type_name, labels in conn.execute(
            """
            SELECT t.typname, array_agg(e.enumlabel::text ORDER BY e.enumsortorder)
            FROM pg_type AS t
            JOIN pg_enum AS e ON e.enumtypid = t.oid
            WHERE t.typnamespace = %s
            GROUP BY t.typname
            ORDER BY t.typname
            """,
            [nsp],
        )
    }


def _pg_functions(conn: psycopg.Connection[Any], nsp: int, norm: _Norm) -> list[dict[str, Any]]:
    """Functions and procedures; bodies are compared in canonical token form."""
    rows = conn.execute(
        """
        SELECT p.proname,
               pg_get_function_identity_arguments(p.oid),
               pg_get_function_result(p.oid),
               p.prokind,
               l.lanname,
               p.provolatile,
               p.proisstrict,
               p.prosecdef,
               p.proparallel,
               p.proconfig,
               p.prosrc
        FROM pg_proc AS p
        JOIN pg_language AS l ON l.oid = p.prolang
        WHERE p.pronamespace = %s
        ORDER BY p.proname, 2
        """,
        [nsp],
    ).fetchall()
    functions: list[dict[str, Any]] = []
    for name, args, result, kind, lang, volatility, strict, secdef, parallel, config, body in rows:
        functions.append(
            {
                "name": name,
                "args": norm(args),
                "result": norm(result),
                "kind": kind,
                "language": lang,
                "volatility": _PG_VOLATILITY.get(volatility, volatility),
                "strict": bool(strict),
                "security_definer": bool(secdef),
                "parallel": parallel,
                "config": sorted(config) if config else None,
                "body": canonical_sql(norm(body)),
            }
        )
    return functions


def _pg_sequences(conn: psycopg.Connection[Any], nsp: int, norm: _Norm) -> dict[str, Any]:
    """Sequences with their parameters and owning column (not their current value)."""
    rows = conn.execute(
        """
        SELECT c.relname,
               format_type(s.seqtypid, NULL),
               s.seqstart, s.seqincrement, s.seqmin, s.seqmax, s.seqcache, s.seqcycle,
               (SELECT tc.relname || '.' || a.attname
                FROM pg_depend AS d
                JOIN pg_class AS tc ON tc.oid = d.refobjid
                JOIN pg_attribute AS a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                WHERE d.classid = 'pg_class'::regclass
                  AND d.objid = c.oid
                  AND d.refclassid = 'pg_class'::regclass
                  AND d.deptype IN ('a', 'i')
                LIMIT 1)
        FROM pg_class AS c
        JOIN pg_sequence AS s ON s.seqrelid = c.oid
        WHERE c.relnamespace = %s
        ORDER BY c.relname
        """,
        [nsp],
    ).fetchall()
    sequences: dict[str, Any] = {}
    for name, seq_type, start, increment, minimum, maximum, cache, cycle, owned_by in rows:
        sequences[name] = {
            "type": norm(seq_type),
            "start": start,
            "increment": increment,
            "min": minimum,
            "max": maximum,
            "cache": cache,
            "cycle": bool(cycle),
            "owned_by": owned_by,
        }
    return sequences


def _pg_migration_rows(
    conn: psycopg.Connection[Any], nsp: int, schema: str
) -> list[list[Any]] | None:
    """``[line, version]`` pairs of river_migration (line is None before version 005)."""
    columns = {
        row[0]
        for row in conn.execute(
            """
            SELECT a.attname
            FROM pg_attribute AS a
            JOIN pg_class AS c ON c.oid = a.attrelid
            WHERE c.relnamespace = %s AND c.relname = 'river_migration'
              AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
            """,
            [nsp],
        )
    }
    if not columns:
        return None
    table = sql.Identifier(schema, "river_migration")
    if "line" in columns:
        query = sql.SQL("SELECT line, version FROM {} ORDER BY line, version").format(table)
    else:
        query = sql.SQL("SELECT NULL::text, version FROM {} ORDER BY version").format(table)
    return [[line, int(version)] for line, version in conn.execute(query)]


# ---------------------------------------------------------------------------------------------
# SQLite
# ---------------------------------------------------------------------------------------------


_XINFO_KEYS = ("seqno", "cid", "name", "desc", "coll", "key")


def _q(identifier: str) -> str:
    """Quote a SQLite identifier."""
    return '"' + identifier.replace('"', '""') + '"'


def _checks(tokens: list[str]) -> list[dict[str, str | None]]:
    """Extract ``CHECK (...)`` expressions (and their constraint names) from table DDL tokens."""
    found: list[dict[str, str | None]] = []
    for i, token in enumerate(tokens):
        if token != "check" or i + 1 >= len(tokens) or tokens[i + 1] != "(":
            continue
        depth = 0
        end = i + 1
        for end in range(i + 1, len(tokens)):
            if tokens[end] == "(":
                depth += 1
            elif tokens[end] == ")":
                depth -= 1
                if depth == 0:
                    break
        name = tokens[i - 1] if i >= 2 and tokens[i - 2] == "constraint" else None
        found.append({"name": name, "expression": _join_tokens(tokens[i + 2 : end])})
    return sorted(found, key=lambda c: (c["name"] or "", c["expression"] or ""))


def _index_where(index_sql: str | None) -> str | None:
    """Return the canonical WHERE predicate of a partial index, or None."""
    if index_sql is None:
        return None
    tokens = sql_tokens(index_sql)
    depth = 0
    for i, token in enumerate(tokens):
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
        elif token == "where" and depth == 0:
            return _join_tokens(tokens[i + 1 :])
    return None


def describe_sqlite(conn: apsw.Connection, schema: str = "main") -> Description:
    """Describe River's objects in one SQLite database (``main`` or an attached name)."""
    sch = _q(schema)

    def rows(query: str, bindings: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in conn.execute(query, bindings)]

    master = rows(
        f"SELECT type, name, tbl_name, sql FROM {sch}.sqlite_master "
        "WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY type, name"
    )
    index_sql = {name: ddl for kind, name, _tbl, ddl in master if kind == "index"}
    table_list = {
        name: {"type": kind, "without_rowid": bool(wr), "strict": bool(strict)}
        for _schema, name, kind, _ncol, wr, strict in rows(f"PRAGMA {sch}.table_list")
    }

    tables: dict[str, Any] = {}
    for kind, name, _tbl, ddl in master:
        if kind != "table":
            continue
        tokens = sql_tokens(ddl or "")
        columns = [
            {
                "cid": cid,
                "name": col_name,
                "type": col_type,
                "not_null": bool(not_null),
                "default": canonical_sql(default),
                "pk": pk,
                "hidden": hidden,
            }
            for cid, col_name, col_type, not_null, default, pk, hidden in rows(
                f"PRAGMA {sch}.table_xinfo({_q(name)})"
            )
        ]
        indexes = []
        for _seq, idx_name, unique, origin, partial in sorted(
            rows(f"PRAGMA {sch}.index_list({_q(name)})"), key=lambda r: r[1]
        ):
            indexes.append(
                {
                    "name": idx_name,
                    "unique": bool(unique),
                    "origin": origin,
                    "partial": bool(partial),
                    "where": _index_where(index_sql.get(idx_name)),
                    "columns": [
                        dict(zip(_XINFO_KEYS, xinfo, strict=True))
                        for xinfo in rows(f"PRAGMA {sch}.index_xinfo({_q(idx_name)})")
                    ],
                }
            )
        foreign_keys = [
            {
                "id": fk_id,
                "seq": seq,
                "table": ref_table,
                "from": col_from,
                "to": col_to,
                "on_update": on_update,
                "on_delete": on_delete,
                "match": match,
            }
            for fk_id, seq, ref_table, col_from, col_to, on_update, on_delete, match in rows(
                f"PRAGMA {sch}.foreign_key_list({_q(name)})"
            )
        ]
        tables[name] = {
            **table_list.get(name, {}),
            "autoincrement": "autoincrement" in tokens,
            "columns": columns,
            "checks": _checks(tokens),
            "indexes": indexes,
            "foreign_keys": foreign_keys,
        }

    others = {
        f"{kind}:{name}": canonical_sql(ddl)
        for kind, name, _tbl, ddl in master
        if kind in ("view", "trigger")
    }
    # The DDL text as SQLite keeps it (layout and comments aside), and each table's indexes in
    # SQLite's order (PRAGMA index_list follows creation order): River's files and ours must
    # write the same statements, constraints and indexes in the same order.
    ddl = {
        f"{kind}:{name}": canonical_sql(text)
        for kind, name, _tbl, text in master
        if kind in ("table", "index") and text is not None
    }
    index_order = {
        name: [str(r[1]) for r in rows(f"PRAGMA {sch}.index_list({_q(name)})")] for name in tables
    }
    return {
        "tables": tables,
        "views_and_triggers": others,
        "river_migration": _sqlite_migration_rows(conn, sch, tables),
        "ddl": ddl,
        "index_order": index_order,
    }


def _sqlite_migration_rows(
    conn: apsw.Connection, sch: str, tables: dict[str, Any]
) -> list[list[Any]] | None:
    """``[line, version]`` pairs of river_migration (line is None before version 005)."""
    table = tables.get("river_migration")
    if table is None:
        return None
    if any(col["name"] == "line" for col in table["columns"]):
        query = f"SELECT line, version FROM {sch}.river_migration ORDER BY line, version"
    else:
        query = f"SELECT NULL, version FROM {sch}.river_migration ORDER BY version"
    return [[line, int(version)] for line, version in conn.execute(query)]
