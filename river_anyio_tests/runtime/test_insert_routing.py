"""Insert notifications are routed by queue: only that queue's producer claims, and a
malformed one is logged once and ignored (the client goes on working)."""

from __future__ import annotations

import logging

import anyio
import pytest

import river_anyio as river
from river_anyio.drivers import TOPIC_INSERT

from .lifecycle_support import SOON, Blocker, Gate, next_event, other_driver

pytestmark = pytest.mark.anyio

#: the poll timer never fires during a test: every claim after start-up is a notification's
NO_POLL = 60.0


async def test_an_insert_notification_wakes_only_its_queues_producer(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    gate = Gate()
    gate.release.set()
    queues = {
        name: river.QueueConfig(max_workers=2, fetch_poll_interval=NO_POLL)
        for name in ("alpha", "beta")
    }
    caplog.set_level(logging.WARNING, logger="river_anyio.notifier")
    with anyio.fail_after(SOON):
        async with river.open_client(database_url, queues=queues, workers=gate.workers()) as run:
            with run.subscribe(river.EventKind.JOB_COMPLETED) as sub:
                fetches = {q: d.fetches for q, d in run.diagnostics.queues.items()}
                # another process: a malformed insert notification, then a job for alpha,
                # whose notification arrives after it
                async with other_driver(database_url) as other:
                    await other.executor().notify_many(TOPIC_INSERT, ["not json"])
                async with river.open_client(database_url) as inserter:
                    job = (
                        await inserter.client.insert(
                            Blocker("routed"), river.InsertOpts(queue="alpha")
                        )
                    ).job
                await next_event(sub, river.EventKind.JOB_COMPLETED, job.id)
                after = {q: d.fetches for q, d in run.diagnostics.queues.items()}
    assert after["alpha"] > fetches["alpha"]
    assert after["beta"] == fetches["beta"], "beta's producer claimed on alpha's notification"
    malformed = [
        r for r in caplog.records if getattr(r, "river_event", None) == "notification_malformed"
    ]
    assert len(malformed) == 1, caplog.records
    assert "not json" in malformed[0].getMessage()
