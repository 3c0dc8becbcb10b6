"""The benchmark aids run: the pipeline aid works every job it dispatches, and the drain
profile accounts for every job of a real drain, on both loops and both databases."""

from __future__ import annotations

import anyio
import pytest

import river_anyio as river
from river_anyio_tests.bench import drain_profile, pipeline

pytestmark = pytest.mark.anyio


async def test_the_pipeline_aid_works_every_job() -> None:
    # run() returns only once the consumer saw every job's completion
    per_job = await pipeline.run(rounds=12, batch=20)
    assert 0 < per_job < 0.01


def test_claimed_rows_follow_the_claims_columns() -> None:
    rows = pipeline.claimed_rows(3, 7)
    jobs = pipeline.rows_to_jobs(rows)
    assert [job.id for job in jobs] == [7, 8, 9]
    assert [job.args for job in jobs] == [{"n": 7}, {"n": 8}, {"n": 9}]
    assert all(job.state is river.JobState.RUNNING for job in jobs)


@pytest.mark.parametrize("flag", ["--rounds", "--batch"])
@pytest.mark.parametrize("value", ["0", "-3", "x"])
def test_the_pipeline_aid_refuses_nonsense_counts(
    flag: str, value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        pipeline.main([flag, value])
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err


async def test_the_drain_profile_accounts_for_every_job(database_url: str) -> None:
    with anyio.fail_after(60):
        result = await drain_profile.profile(database_url, total=300, max_workers=10)
    assert result.jobs == 300
    assert sum(s.jobs for s in result.claims) == 300
    assert sum(s.jobs for s in result.completions) == 300
    # one claim and one completion in flight at a time, all within the drain
    assert 0 < result.claiming <= 1
    assert 0 < result.writing <= 1
    assert result.claims[0].start < result.completions[-1].end
    assert 0 < result.most_unwritten <= 300
    assert result.tail >= 0
    assert result.cpu_seconds > 0
    assert 0 <= result.gc_seconds < result.cpu_seconds
    report = result.report("loop", 10)
    assert report.startswith("drain of 300 jobs (loop, 10 workers)")
    assert "claims: " in report and "completions: " in report and "client: " in report


@pytest.mark.parametrize(
    "argv",
    [
        ["--database-url", "sqlite://x.db"],
        ["--database-url", "sqlite://x.db", "--yes", "-n", "0"],
        ["--database-url", "sqlite://x.db", "--yes", "--max-workers", "-2"],
    ],
)
def test_the_drain_profile_refuses_without_yes_or_with_no_jobs(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        drain_profile.main(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--yes" in err or "at least 1" in err
