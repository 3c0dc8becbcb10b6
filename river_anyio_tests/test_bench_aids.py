"""The benchmark aids run: the pipeline aid works every job it dispatches, on both loops."""

from __future__ import annotations

import pytest

import river_anyio as river
from river_anyio_tests.bench import pipeline

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
