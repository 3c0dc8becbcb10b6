"""Configuration validation: every invalid ``open_client``/``QueueConfig``/``Workers.add``
setting is a :class:`river_anyio.ConfigError` naming its field, raised before anything
connects."""

from __future__ import annotations

import datetime as dt
import inspect
import warnings
from pathlib import Path
from typing import Any, ClassVar

import anyio
import attrs
import pytest

import river_anyio as river
from river_anyio._config import ClientConfig

from .lifecycle_support import Gate


@attrs.frozen
class Other:
    kind: ClassVar[str] = "other_kind"


@attrs.frozen
class NoKind:
    x: int = 0


@attrs.frozen
class ShortKind:
    kind: ClassVar[str] = "a"


@attrs.frozen
class SpacedKind:
    kind: ClassVar[str] = "bad kind"


@attrs.frozen
class IntKind:
    kind: ClassVar[int] = 5


class NotAttrs:
    kind: ClassVar[str] = "not_attrs"


async def async_work(ctx: river.WorkContext, job: river.Job[Any]) -> None:
    return None


def sync_work(ctx: river.WorkContext, job: river.Job[Any]) -> None:
    return None


def _workers() -> river.Workers:
    return Gate().workers()


def _q(**kw: Any) -> dict[str, river.QueueConfig]:
    return {"default": river.QueueConfig(max_workers=1, **kw)}


class _NoMethods:
    pass


# (options, field, message fragment)
CLIENT_CASES: list[tuple[dict[str, Any], str, str]] = [
    # ids
    ({"id": ""}, "id", "must be a non-empty str"),
    ({"id": "x" * 101}, "id", "ID cannot be longer than 100 characters"),
    ({"id": 7}, "id", "must be a non-empty str"),
    # job_timeout
    ({"job_timeout": 0}, "job_timeout", "must be greater than zero"),
    ({"job_timeout": -1}, "job_timeout", "must be greater than zero"),
    ({"job_timeout": dt.timedelta(0)}, "job_timeout", "must be greater than zero"),
    ({"job_timeout": "60"}, "job_timeout", "must be a number of seconds or a timedelta, not str"),
    ({"job_timeout": float("inf")}, "job_timeout", "must be finite"),
    # soft_stop_timeout
    ({"soft_stop_timeout": -1}, "soft_stop_timeout", "must be at least 0s"),
    ({"soft_stop_timeout": float("nan")}, "soft_stop_timeout", "must be finite"),
    ({"soft_stop_timeout": [1]}, "soft_stop_timeout", "not list"),
    # fetch cooldown and poll interval
    ({"fetch_cooldown": 0.0005}, "fetch_cooldown", "must be at least 0.001s"),
    ({"fetch_cooldown": 0}, "fetch_cooldown", "must be at least 0.001s"),
    ({"fetch_cooldown": None}, "fetch_cooldown", "not None"),
    ({"fetch_cooldown": True}, "fetch_cooldown", "not bool"),
    ({"fetch_poll_interval": 0}, "fetch_poll_interval", "must be at least 0.001s"),
    (
        {"fetch_poll_interval": 0.05},
        "fetch_poll_interval",
        "cannot be shorter than fetch_cooldown (0.1s)",
    ),
    (
        {"fetch_cooldown": 2, "fetch_poll_interval": dt.timedelta(seconds=1)},
        "fetch_poll_interval",
        "cannot be shorter than fetch_cooldown (2s)",
    ),
    (
        {"queues": _q(fetch_poll_interval=0.05), "workers": _workers()},
        "queues['default'].fetch_poll_interval",
        "cannot be shorter than the queue's fetch_cooldown (0.1s)",
    ),
    (
        {"queues": _q(fetch_cooldown=3), "workers": _workers()},
        "queues['default'].fetch_poll_interval",
        "cannot be shorter than the queue's fetch_cooldown (3s)",
    ),
    # queues
    (
        {"queues": {"": river.QueueConfig(max_workers=1)}, "workers": _workers()},
        "queues['']",
        "queue name cannot be empty",
    ),
    (
        {"queues": {"q" * 65: river.QueueConfig(max_workers=1)}, "workers": _workers()},
        f"queues[{'q' * 65!r}]",
        "queue name cannot be longer than 64 characters",
    ),
    (
        {"queues": {"Bad Name": river.QueueConfig(max_workers=1)}, "workers": _workers()},
        "queues['Bad Name']",
        "queue name is invalid",
    ),
    (
        {"queues": {3: river.QueueConfig(max_workers=1)}, "workers": _workers()},
        "queues[3]",
        "must be a str, not int",
    ),
    ({"queues": ["default"], "workers": _workers()}, "queues", "must be a mapping"),
    (
        {"queues": {"default": 5}, "workers": _workers()},
        "queues['default']",
        "must be a QueueConfig, not int",
    ),
    ({"queues": _q()}, "workers", "queues are configured but no workers are registered"),
    ({"queues": _q(), "workers": river.Workers()}, "workers", "no workers are registered"),
    ({"queues": _q(), "workers": {"blocker": async_work}}, "workers", "not dict"),
    # max_attempts
    ({"max_attempts": 0}, "max_attempts", "must be an int between 1 and 2**63 - 1"),
    ({"max_attempts": 2**63}, "max_attempts", "must be an int between 1 and 2**63 - 1"),
    ({"max_attempts": True}, "max_attempts", "must be an int between 1 and 2**63 - 1"),
    ({"max_attempts": 2.0}, "max_attempts", "must be an int between 1 and 2**63 - 1"),
    # bools
    ({"poll_only": "yes"}, "poll_only", "must be a bool"),
    ({"poll_only": 1}, "poll_only", "must be a bool"),
    ({"fetch_only_known_kinds": None}, "fetch_only_known_kinds", "must be a bool"),
    # user objects' shapes
    ({"retry_policy": _NoMethods()}, "retry_policy", "must be an object with a next_retry()"),
    ({"retry_policy": lambda row, now: now}, "retry_policy", "next_retry() method"),
    ({"error_handler": _NoMethods()}, "error_handler", "handle_error() method"),
    ({"middleware": _NoMethods()}, "middleware", "must be a list"),
    ({"middleware": "work"}, "middleware", "must be a list"),
    ({"middleware": [_NoMethods()]}, "middleware[0]", "must have a work() and/or insert()"),
    ({"hooks": _NoMethods()}, "hooks", "must be a list"),
    ({"hooks": [_NoMethods()]}, "hooks[0]", "insert_begin, work_begin, work_end, jobs_claimed"),
    # unknown option names
    ({"queue": _q()}, "queue", "is not an open_client option"),
    ({"soft_stop_timout": 1}, "soft_stop_timout", "is not an open_client option"),
    ({"maxWorkers": 1}, "maxWorkers", "is not an open_client option"),
    # schema
    ({"schema": "1bad"}, "schema", "must match ^[a-zA-Z_][a-zA-Z0-9_]*$"),
    ({"schema": "a" * 47}, "schema", "at most 46 characters"),
    ({"schema": 5}, "schema", "must match"),
    # pools and thresholds
    ({"thread_workers": 0}, "thread_workers", "must be an int between 1 and 1024"),
    ({"thread_workers": 1025}, "thread_workers", "must be an int between 1 and 1024"),
    ({"process_workers": 1.5}, "process_workers", "must be an int between 1 and 1024"),
    ({"process_workers": False}, "process_workers", "must be an int between 1 and 1024"),
    ({"job_stuck_threshold": -1}, "job_stuck_threshold", "must be at least 0s"),
    # the private test hook (a ClientConfig's tuning) is validated too
    ({"_tuning": {"completer_pauses": ()}}, "_completer_pauses", "must not be empty"),
    ({"_tuning": {"completer_pauses": 1.0}}, "_completer_pauses", "must be a sequence of"),
    ({"_tuning": {"completer_pauses": (0.1, -1)}}, "_completer_pauses", "must be at least 0s"),
    (
        {"_tuning": {"completer_try_timeout": 0}},
        "_completer_try_timeout",
        "must be greater than zero",
    ),
    ({"_tuning": {"elect_interval": 0}}, "_elect_interval", "must be greater than zero"),
    ({"_tuning": {"maintenance_stagger": 0}}, "_maintenance_stagger", "must be a bool"),
    # a config that is not one
    ({"_config": {"fetch_cooldown": 0.05}}, "config", "must be a river_anyio.Config, not dict"),
    # the database argument
    ({"database": 42}, "database", "must be a database URL or a driver"),
    ({"driver_options": [1]}, "driver_options", "must be a dict"),
    (
        {"driver_options": {"busy_timout": 1}},
        "driver_options",
        "'busy_timout' is not an option of the sqlite driver "
        "(options: attach, busy_timeout, sqlite_module)",
    ),
    ({"driver_options": {"schema": "s"}}, "driver_options", "use open_client's schema option"),
    (
        {"database": "postgresql://u@localhost/db", "driver_options": {"pool_size": 3}},
        "driver_options",
        "'pool_size' is not an option of the postgres driver",
    ),
    ({"clock": 5}, "clock", "must be an object with a now() method"),
]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("options", "field", "message"),
    CLIENT_CASES,
    ids=[f"{i}-{c[1]}" for i, c in enumerate(CLIENT_CASES)],
)
async def test_open_client_rejects(
    tmp_path: Path, options: dict[str, Any], field: str, message: str
) -> None:
    options = dict(options)
    database = options.pop("database", f"sqlite://{tmp_path / 'never.sqlite3'}")
    tuning = options.pop("_tuning", None)
    with pytest.raises(river.ConfigError) as info:
        config = ClientConfig(**tuning) if tuning is not None else options.pop("_config", None)
        async with river.open_client(database, config, **options):
            pytest.fail("the body must not run")
    assert type(info.value) is river.ConfigError
    assert info.value.field == field, info.value
    assert message in info.value.rule, info.value.rule
    assert str(info.value) == f"{field}: {info.value.rule}"
    opened = [p async for p in anyio.Path(tmp_path).iterdir()]
    assert not opened, "validation must fail before anything is opened"


def _plain_config_case(case: tuple[dict[str, Any], str, str]) -> bool:
    """A case ``Config(**options)`` alone can judge: not about the database argument, the
    private tuning or the config argument, and not a driver option name (which needs the
    database URL to say which driver)."""
    options, field, message = case
    special = {"database", "_tuning", "_config"} & set(options)
    return not special and not (field == "driver_options" and "not an option of" in message)


CONFIG_CASES = [c for c in CLIENT_CASES if _plain_config_case(c)]


@pytest.mark.parametrize(
    ("options", "field", "message"),
    CONFIG_CASES,
    ids=[f"{i}-{c[1]}" for i, c in enumerate(CONFIG_CASES)],
)
def test_config_rejects_the_same_values(options: dict[str, Any], field: str, message: str) -> None:
    """``Config(...)`` raises what ``open_client(url, **options)`` raises (but for the option
    names it does not have, a TypeError, and the checks that need the database URL)."""
    if any(k not in river.ConfigOptions.__optional_keys__ for k in options):
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            river.Config(**options)
        return
    with pytest.raises(river.ConfigError) as info:
        river.Config(**options)
    assert (info.value.field, str(info.value)) == (field, f"{field}: {info.value.rule}")
    assert message in info.value.rule, info.value.rule


@pytest.mark.anyio
async def test_run_client_validates_the_same_way(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'x.sqlite3'}"
    with pytest.raises(river.ConfigError) as info:
        river.Config(fetch_cooldown=0)
    assert info.value.field == "fetch_cooldown"
    for database, config, field in (
        (url, river.Config(driver_options={"busy_timout": 1}), "driver_options"),
        (42, river.Config(), "database"),
        (url, {"fetch_cooldown": 1}, "config"),
    ):
        async with anyio.create_task_group() as tg:
            with pytest.raises(river.ConfigError) as info:
                await tg.start(river.run_client, database, config)
        assert info.value.field == field
    assert not [p async for p in anyio.Path(tmp_path).iterdir()]


QUEUE_CASES: list[tuple[dict[str, Any], str, str]] = [
    ({"max_workers": 0}, "max_workers", "must be between 1 and 10,000, got 0"),
    ({"max_workers": -5}, "max_workers", "must be between 1 and 10,000, got -5"),
    ({"max_workers": 10_001}, "max_workers", "must be between 1 and 10,000, got 10001"),
    ({"max_workers": 2.0}, "max_workers", "must be an int, not float"),
    ({"max_workers": True}, "max_workers", "must be an int, not bool"),
    ({"max_workers": "5"}, "max_workers", "must be an int, not str"),
    ({"max_workers": 1, "fetch_cooldown": 0}, "fetch_cooldown", "must be at least 0.001s"),
    ({"max_workers": 1, "fetch_cooldown": -1}, "fetch_cooldown", "must be at least 0.001s"),
    ({"max_workers": 1, "fetch_cooldown": "1"}, "fetch_cooldown", "not str"),
    (
        {"max_workers": 1, "fetch_poll_interval": 0.0001},
        "fetch_poll_interval",
        "must be at least 0.001s",
    ),
    (
        {"max_workers": 1, "fetch_poll_interval": float("inf")},
        "fetch_poll_interval",
        "must be finite",
    ),
    (
        {"max_workers": 1, "fetch_cooldown": 1, "fetch_poll_interval": 0.5},
        "fetch_poll_interval",
        "cannot be shorter than fetch_cooldown (1s)",
    ),
]


@pytest.mark.parametrize(("options", "field", "message"), QUEUE_CASES)
def test_queue_config_rejects(options: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(river.ConfigError) as info:
        river.QueueConfig(**options)
    assert info.value.field == field
    assert message in info.value.rule, info.value.rule


def test_queue_config_accepts_the_bounds() -> None:
    assert river.QueueConfig(max_workers=1).max_workers == 1
    assert river.QueueConfig(max_workers=10_000).max_workers == 10_000
    qc = river.QueueConfig(
        max_workers=3, fetch_cooldown=0.001, fetch_poll_interval=dt.timedelta(milliseconds=1)
    )
    assert (qc.fetch_cooldown, qc.fetch_poll_interval) == (0.001, 0.001)


def _local_sync_function() -> Any:
    def work(ctx: river.WorkContext, job: river.Job[Any]) -> None:
        return None

    return work


class _NotCallableWork:
    work = 5


def _twice() -> river.Workers:
    workers = river.Workers()
    workers.add(Other, async_work)
    return workers


WORKER_CASES: list[tuple[Any, dict[str, Any], str, str]] = [
    (NotAttrs, {"work": async_work}, "workers", "is not an attrs class"),
    (NoKind, {"work": async_work}, "workers", "NoKind needs a `kind` class attribute (str)"),
    (IntKind, {"work": async_work}, "workers", "needs a `kind` class attribute (str)"),
    (ShortKind, {"work": async_work}, "workers", "at least 2 characters"),
    (SpacedKind, {"work": async_work}, "workers", "should match the pattern"),
    (Other, {"work": sync_work}, "workers", "must be an async function"),
    (Other, {"work": async_work, "run_in": "thread"}, "workers", "needs a plain (sync) function"),
    (Other, {"work": async_work, "run_in": "process"}, "workers", "needs a plain (sync)"),
    (Other, {"work": sync_work, "run_in": "fiber"}, "run_in", "must be 'loop', 'thread' or"),
    (
        Other,
        {"work": _local_sync_function(), "run_in": "process"},
        "workers",
        "needs an importable module-level function",
    ),
    (Other, {"work": 5}, "workers", "must be a function or an object with work()"),
    (Other, {"work": _NotCallableWork()}, "workers", "must be a function or an object with"),
    (Other, {"work": async_work, "timeout": 0}, "workers[other_kind].timeout", "must be positive"),
    (
        Other,
        {"work": async_work, "timeout": -1.5},
        "workers[other_kind].timeout",
        "must be positive",
    ),
    (
        Other,
        {"work": async_work, "timeout": "10"},
        "workers[other_kind].timeout",
        "must be a positive number of seconds",
    ),
    (
        Other,
        {"work": async_work, "timeout": float("nan")},
        "workers[other_kind].timeout",
        "must be a positive number of seconds",
    ),
]


@pytest.mark.parametrize(("args_cls", "options", "field", "message"), WORKER_CASES)
def test_workers_add_rejects(
    args_cls: Any, options: dict[str, Any], field: str, message: str
) -> None:
    workers = river.Workers()
    options = dict(options)
    work = options.pop("work")
    with pytest.raises(river.ConfigError) as info:
        workers.add(args_cls, work, **options)
    assert info.value.field == field
    assert message in info.value.rule, info.value.rule
    assert len(workers) == 0  # nothing half-registered


def test_a_kind_registered_twice_is_rejected() -> None:
    workers = _twice()
    with pytest.raises(river.ConfigError) as info:
        workers.add(Other, async_work)
    assert info.value.field == "workers"
    assert info.value.rule == "worker for kind 'other_kind' is already registered"
    with pytest.raises(river.ConfigError, match="already registered"):

        @workers.register(Other)
        async def again(ctx: river.WorkContext, job: river.Job[Any]) -> None:
            return None

    assert workers.kinds() == ["other_kind"]


@pytest.mark.anyio
async def test_valid_boundary_values_are_accepted(sqlite_url: str) -> None:
    """The validators do not reject what River accepts."""
    gate = Gate()
    async with river.open_client(
        sqlite_url,
        id="x" * 100,
        queues={
            "default": river.QueueConfig(max_workers=10_000),
            "a-1_b": river.QueueConfig(max_workers=1, fetch_cooldown=0.001),
        },
        workers=gate.workers(),
        job_timeout=None,
        soft_stop_timeout=0,
        fetch_cooldown=dt.timedelta(milliseconds=1),
        fetch_poll_interval=0.001 * 1000,
        max_attempts=32767,
        thread_workers=1024,
        process_workers=1,
        job_stuck_threshold=0,
        poll_only=True,
        fetch_only_known_kinds=True,
    ) as run:
        assert run.config.fetch_cooldown == 0.001
        assert run.config.job_timeout is None
        assert set(run.diagnostics.queues) == {"default", "a-1_b"}


def test_driver_option_names_match_the_drivers() -> None:
    from river_anyio._runtime._entry import DRIVER_OPTIONS
    from river_anyio.drivers.postgres import open_postgres
    from river_anyio.drivers.sqlite import open_sqlite

    for dialect, opener in (("postgres", open_postgres), ("sqlite", open_sqlite)):
        params = set(inspect.signature(opener).parameters) - {"url", "url_or_path", "schema"}
        assert params == DRIVER_OPTIONS[dialect]


# --- Config: one set of defaults, the options in step, options over a config -------------------


def test_config_holds_rivers_defaults() -> None:
    config = river.Config()
    expected = {
        "queues": {},
        "id": None,
        "schema": None,
        "max_attempts": 25,
        "job_timeout": 60.0,
        "soft_stop_timeout": None,
        "fetch_cooldown": 0.1,
        "fetch_poll_interval": 1.0,
        "poll_only": False,
        "fetch_only_known_kinds": False,
        "claim_ahead": False,  # True claims ahead of free slots, beyond River
        "error_handler": None,
        "middleware": (),
        "hooks": (),
        "job_stuck_threshold": 10.0,
        "thread_workers": 16,
        "process_workers": 4,
        "periodic_jobs": (),
        "maintenance": river.MaintenanceConfig(),
        "leader_election_disabled": False,
        "auto_migrate": False,
        "driver_options": {},
        "clock": None,
        "health": river.HealthConfig(),
        "wait_for_database": False,
    }
    assert {name: getattr(config, name) for name in expected} == expected
    assert isinstance(config.retry_policy, river.DefaultRetryPolicy)
    assert isinstance(config.workers, river.Workers) and len(config.workers) == 0
    assert set(expected) | {"retry_policy", "workers"} == {
        a.name for a in attrs.fields(river.Config)
    }
    assert config.rescue_after == 3600.0
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.job_timeout = 5  # type: ignore[misc]


def test_config_options_are_configs_fields_with_the_same_types() -> None:
    """``ConfigOptions`` (open_client's keyword options) is kept in step with ``Config``: the
    same names, each typed as ``Config(...)`` accepts it."""
    import typing

    import river_anyio._config as config_module

    init = typing.get_type_hints(river.Config.__init__, vars(config_module))
    init.pop("return")
    options = typing.get_type_hints(river.ConfigOptions)
    assert set(options) == set(init)
    assert river.ConfigOptions.__optional_keys__ == frozenset(init)  # none is required
    mismatched = {name: (options[name], init[name]) for name in init if options[name] != init[name]}
    assert not mismatched


def test_durations_read_back_as_seconds() -> None:
    config = river.Config(
        job_timeout=dt.timedelta(minutes=2),
        soft_stop_timeout=dt.timedelta(seconds=3),
        fetch_cooldown=1,
        fetch_poll_interval=dt.timedelta(seconds=2),
        job_stuck_threshold=dt.timedelta(milliseconds=500),
    )
    assert (
        config.job_timeout,
        config.soft_stop_timeout,
        config.fetch_cooldown,
        config.fetch_poll_interval,
        config.job_stuck_threshold,
    ) == (120.0, 3.0, 1.0, 2.0, 0.5)
    assert config.rescue_after == 3600.0 + 120.0


@pytest.mark.anyio
async def test_options_apply_over_a_config(sqlite_url: str) -> None:
    gate = Gate()
    gate.release.set()
    config = river.Config(
        queues={"default": river.QueueConfig(max_workers=2)},
        workers=gate.workers(),
        id="from-config",
        job_timeout=30,
    )
    async with river.open_client(sqlite_url, config, id="from-option", fetch_cooldown=0.5) as run:
        assert isinstance(run.config, river.Config)
        assert (run.config.id, run.config.job_timeout, run.config.fetch_cooldown) == (
            "from-option",
            30.0,
            0.5,
        )
        assert run.client.id == "from-option"
        assert set(run.diagnostics.queues) == {"default"}
    assert config.id == "from-config"  # the caller's config is not changed
    # an option can still make the whole configuration invalid
    with pytest.raises(river.ConfigError, match="fetch_poll_interval: cannot be shorter"):
        river.open_client(sqlite_url, config, fetch_cooldown=2)


@pytest.mark.anyio
async def test_one_config_starts_clients_with_their_own_default_ids(sqlite_url: str) -> None:
    """A Config without an ID gets River's default (host name and start time) per client,
    when the client starts: one Config can start several clients."""
    config = river.Config()
    async with river.open_client(sqlite_url, config) as a:
        await anyio.sleep(0.001)  # the default ID has microseconds
        async with river.open_client(sqlite_url, config) as b:
            assert a.client.id != b.client.id
    assert config.id is None


@pytest.mark.anyio
@pytest.mark.parametrize("entry", ["open_client", "run_client"])
async def test_the_ignored_maintenance_warning_prints_once(database_url: str, entry: str) -> None:
    gate = Gate()
    config = river.Config(
        queues={"default": river.QueueConfig(max_workers=1)},
        workers=gate.workers(),
        leader_election_disabled=True,
        maintenance=river.MaintenanceConfig(scheduler_interval=1),
    )
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")  # a repeated warning is recorded again
        if entry == "open_client":
            async with river.open_client(database_url, config) as run:
                assert run.config.leader_election_disabled
        else:
            async with anyio.create_task_group() as tg:
                run = await tg.start(river.run_client, database_url, config)
                run.stop()
    assert [(w.category, str(w.message)) for w in record] == [
        (
            UserWarning,
            "maintenance settings are ignored: leader_election_disabled=True means this "
            "client never leads, so it never runs maintenance",
        )
    ]
    if entry == "open_client":  # (run_client runs in a task of its own: no caller's line)
        assert record[0].filename == __file__  # it points at the caller's line
    # default maintenance settings are not "settings", and are not warned about
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        river.open_client(database_url, config, maintenance=None)


@pytest.mark.anyio
async def test_a_callers_driver_is_checked_before_the_client_starts(database_url: str) -> None:
    from river_anyio.drivers import open_driver

    async with open_driver(database_url) as driver:
        with pytest.raises(river.ConfigError) as info:
            river.open_client(driver, driver_options={"busy_timeout": 1})
        assert (info.value.field, info.value.rule) == (
            "driver_options",
            "only applies when opening a database from a URL",
        )
        # another schema puts the client on driver.with_schema() (River Go's clients of
        # several schemas on one driver), which checks it at once: an attached database on
        # SQLite (on PostgreSQL any schema name is taken; test_schema_views runs clients there)
        if driver.dialect == "sqlite":
            with pytest.raises(river.ConfigError) as info:
                river.open_client(driver, schema="some_other_schema")
            assert info.value.field == "schema"
            assert "no attached database named 'some_other_schema'" in info.value.rule
        # the driver's own schema is no conflict, and the client runs on that driver
        async with river.open_client(driver, schema=driver.schema) as run:
            assert run.client.driver is driver
