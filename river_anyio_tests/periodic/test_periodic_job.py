"""Defining periodic jobs: schedules, River's ID rules, the client's job set and its
configuration through ``open_client``."""

from __future__ import annotations

import datetime as dt

import attrs
import pytest

import river_anyio as river

UTC = dt.UTC

pytestmark = pytest.mark.anyio


@attrs.frozen
class Ping:
    kind = "ping"


def job(**kw: object) -> river.PeriodicJob:
    return river.PeriodicJob("@hourly", Ping, **kw)  # type: ignore[arg-type]


# --- schedules -------------------------------------------------------------------------------


def test_schedule_forms() -> None:
    assert river.PeriodicJob("*/5 * * * *", Ping).schedule == river.cron("*/5 * * * *")
    assert river.PeriodicJob(dt.timedelta(minutes=5), Ping).schedule == river.every(300)
    custom = river.every(dt.timedelta(seconds=90))
    assert river.PeriodicJob(custom, Ping).schedule is custom


def test_a_bad_schedule_is_an_error_when_the_job_is_defined() -> None:
    with pytest.raises(river.CronError, match="minute"):
        river.PeriodicJob("61 * * * *", Ping)
    with pytest.raises(river.CronError, match="time zone"):
        river.PeriodicJob("CRON_TZ=Europe/Nowhere @daily", Ping)
    with pytest.raises(river.ConfigError, match="schedule"):
        river.PeriodicJob(300, Ping)  # type: ignore[arg-type]


def test_interval_schedule_steps_in_absolute_time() -> None:
    ny = dt.timezone(dt.timedelta(hours=-5))
    at = dt.datetime(2024, 3, 10, 1, 30, tzinfo=ny)
    assert river.every(3600).next(at) == at + dt.timedelta(hours=1)
    with pytest.raises(river.ConfigError, match="greater than zero"):
        river.every(0)
    with pytest.raises(river.ConfigError, match="interval"):
        river.every("5m")  # type: ignore[arg-type]
    with pytest.raises(river.ValidationError):
        river.every(1).next(dt.datetime(2024, 1, 1))


def test_interval_keeps_wall_clock_out_of_it_across_dst() -> None:
    import zoneinfo

    ny = zoneinfo.ZoneInfo("America/New_York")
    before = dt.datetime(2024, 3, 10, 1, 30, tzinfo=ny)
    after = river.every(3600).next(before)
    assert after.isoformat() == "2024-03-10T03:30:00-04:00"


# --- the job definition ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "good", ["a1", "nightly_report", "report-v2", "ns:job/1", "x[1]", "a.b+c", "x" * 127]
)
def test_valid_ids(good: str) -> None:
    assert job(id=good).id == good


@pytest.mark.parametrize(
    ("bad", "rule"),
    [
        ("", "must not be empty"),
        ("a", "should match"),  # at least two characters, as a job kind
        ("-dash", "should match"),
        ("has space", "should match"),
        ("ünïcode", "should match"),
        ("x" * 128, "less than 128"),
        ("·" * 64, "less than 128"),  # 128 bytes in UTF-8
        (5, "must be a str"),
    ],
)
def test_invalid_ids(bad: object, rule: str) -> None:
    with pytest.raises(river.ConfigError, match=rule) as info:
        job(id=bad)
    assert info.value.field == "id"


def test_other_fields_are_checked() -> None:
    with pytest.raises(river.ConfigError, match="make_args"):
        river.PeriodicJob("@daily", "not callable")  # type: ignore[arg-type]
    with pytest.raises(river.ConfigError, match="opts"):
        job(opts={"queue": "x"})
    with pytest.raises(river.ConfigError, match="run_on_start"):
        job(run_on_start=1)
    j = job(opts=river.InsertOpts(queue="reports"), id="hourly_ping", run_on_start=True)
    assert (j.opts, j.id, j.run_on_start) == (
        river.InsertOpts(queue="reports"),
        "hourly_ping",
        True,
    )
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        j.id = "other"  # type: ignore[misc]


# --- the client's job set (River's PeriodicJobBundle) -----------------------------------------


def test_add_remove_and_handles() -> None:
    jobs = river.PeriodicJobs()
    a = jobs.add(job(id="a1"))
    b, c = jobs.add_many([job(), job(id="c1")])
    assert [h.value for h in (a, b, c)] == [0, 1, 2]
    assert len(jobs) == 3 and "a1" in jobs and b in jobs
    assert jobs.get("c1") is jobs.get(c)

    with pytest.raises(river.ConfigError, match="already registered: a1"):
        jobs.add(job(id="a1"))
    # a batch is added whole or not at all
    with pytest.raises(river.ConfigError, match="already registered: d1"):
        jobs.add_many([job(id="d1"), job(id="d1")])
    with pytest.raises(river.ConfigError, match="PeriodicJob"):
        jobs.add_many([job(id="e1"), "nope"])  # type: ignore[list-item]
    assert len(jobs) == 3 and "d1" not in jobs and "e1" not in jobs

    assert jobs.remove(a) is True
    assert jobs.remove("a1") is False
    assert jobs.remove_by_id("c1") is True
    assert jobs.remove_by_id("c1") is False
    assert list(jobs) == [b]
    jobs.add(job(id="a1"))  # the ID is free again
    jobs.remove_many([b, "a1", "missing"])
    assert len(jobs) == 0
    jobs.add_many([job(id="x1"), job(id="y1")])
    jobs.remove_many_by_id(["x1"])
    assert list(jobs) == [river.PeriodicJobHandle(5)]
    jobs.clear()
    assert len(jobs) == 0
    assert jobs.add(job()).value == 6  # handles are never reused, even after clear()
    with pytest.raises(river.ValidationError):
        jobs.remove(5)  # type: ignore[arg-type]


def test_changes_are_announced() -> None:
    jobs = river.PeriodicJobs()
    seen: list[int] = []
    unsubscribe = jobs._subscribe(lambda: seen.append(len(jobs)))
    h = jobs.add(job())
    jobs.remove(h)
    jobs.remove(h)  # nothing removed: no announcement
    jobs.add_many([job(), job()])
    jobs.clear()
    unsubscribe()
    jobs.add(job())
    assert seen == [1, 0, 2, 0]


# --- configuration ---------------------------------------------------------------------------


async def test_open_client_takes_periodic_jobs(sqlite_url: str) -> None:
    async with river.open_client(sqlite_url, periodic_jobs=[job(id="p1"), job()]) as run:
        jobs = run.client.periodic_jobs
        assert len(jobs) == 2 and "p1" in jobs
        assert run.config.periodic_jobs == (job(id="p1"), job())
        jobs.add(job(id="p2"))
        assert len(run.client.periodic_jobs) == 3


@pytest.mark.parametrize(
    ("value", "field", "rule"),
    [
        ("@daily", "periodic_jobs", "must be a list"),
        ([job(), "@daily"], "periodic_jobs[1]", "must be a PeriodicJob"),
        ([job(id="same"), job(id="same")], "periodic_jobs[1].id", "already registered: same"),
    ],
)
async def test_open_client_rejects_bad_periodic_jobs(
    sqlite_url: str, value: object, field: str, rule: str
) -> None:
    with pytest.raises(river.ConfigError, match=rule) as info:
        async with river.open_client(sqlite_url, periodic_jobs=value):
            pass
    assert info.value.field == field
