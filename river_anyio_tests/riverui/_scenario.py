"""A river_anyio client working a small, known mix of jobs, for River UI to show.

Shared by the River UI tests and the screenshot script (``screenshots.py``), so the pictures
in the how-to show what the tests check. :func:`work_the_mix` leaves the database with jobs in
every state River UI counts, one of them running in the open client, and the ``reports`` queue
paused with jobs waiting in it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import attrs

import river_anyio as river

#: Fast fetching so the tests do not wait on polls.
CLIENT_OPTIONS: dict[str, Any] = {"fetch_cooldown": 0.02, "fetch_poll_interval": 0.2}
PAUSED_QUEUE = "reports"


class PaymentDeclinedError(Exception):
    """The error the charge worker raises, so its text is ours."""


@attrs.frozen
class SendEmail:
    kind: ClassVar[str] = "send_email"
    to: str


@attrs.frozen
class ChargeCard:
    kind: ClassVar[str] = "charge_card"
    customer: str
    amount_cents: int


@attrs.frozen
class CloseAccount:
    kind: ClassVar[str] = "close_account"
    customer: str


@attrs.frozen
class ResizeImage:
    kind: ClassVar[str] = "resize_image"
    path: str


@attrs.frozen
class MonthlyReport:
    kind: ClassVar[str] = "monthly_report"
    month: str


@attrs.frozen
class Export:
    """Runs until cancelled."""

    kind: ClassVar[str] = "export_orders"
    since: str


class Workers:
    """The mix's workers; records which export attempts saw their cancellation."""

    def __init__(self) -> None:
        self.export_started: dict[int, anyio.Event] = {}
        self.export_cancelled: dict[int, anyio.Event] = {}

    def started(self, job_id: int) -> anyio.Event:
        return self.export_started.setdefault(job_id, anyio.Event())

    def cancelled(self, job_id: int) -> anyio.Event:
        return self.export_cancelled.setdefault(job_id, anyio.Event())

    async def send_email(self, ctx: river.WorkContext, job: river.Job[SendEmail]) -> None:
        ctx.set_metadata("delivered_to", job.args.to)

    async def charge_card(self, ctx: river.WorkContext, job: river.Job[ChargeCard]) -> None:
        raise PaymentDeclinedError(
            f"card declined for {job.args.customer}: insufficient funds "
            f"({job.args.amount_cents} cents)"
        )

    async def close_account(
        self, ctx: river.WorkContext, job: river.Job[CloseAccount]
    ) -> river.Outcome:
        return river.cancel(f"{job.args.customer} reopened the account")

    async def resize_image(
        self, ctx: river.WorkContext, job: river.Job[ResizeImage]
    ) -> river.Outcome:
        return river.snooze(dt.timedelta(hours=1))

    async def export_orders(self, ctx: river.WorkContext, job: river.Job[Export]) -> None:
        self.started(job.id).set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            self.cancelled(job.id).set()
            raise

    async def monthly_report(self, ctx: river.WorkContext, job: river.Job[MonthlyReport]) -> None:
        pass

    def registry(self) -> river.Workers:
        w = river.Workers()
        w.add(SendEmail, self.send_email)
        w.add(ChargeCard, self.charge_card)
        w.add(CloseAccount, self.close_account)
        w.add(ResizeImage, self.resize_image)
        w.add(Export, self.export_orders, timeout=None)
        w.add(MonthlyReport, self.monthly_report)
        return w


@attrs.frozen
class Mix:
    """What :func:`work_the_mix` inserted and what became of it."""

    completed: list[int]
    retryable: int  # failed once, retries in an hour
    discarded: int  # failed its only attempt
    cancelled: int  # its worker cancelled it
    snoozed: int  # scheduled, an hour ahead
    scheduled: int  # inserted for tomorrow
    pending: int
    available: list[int]  # waiting in the paused queue
    running: int  # the export, running until cancelled

    def counts(self) -> dict[str, int]:
        """The count of each state, as River UI's ``/api/states`` must give it."""
        return {
            "available": len(self.available),
            "cancelled": 1,
            "completed": len(self.completed),
            "discarded": 1,
            "pending": 1,
            "retryable": 1,
            "running": 1,
            "scheduled": 2,
        }


class _ChargeRetry:
    """Retries a declined charge in an hour (so it stays ``retryable``)."""

    def next_retry(self, job: river.JobRow, now: dt.datetime) -> dt.datetime:
        return now + dt.timedelta(hours=1)


@asynccontextmanager
async def open_mix_client(url: str, workers: Workers) -> AsyncIterator[river.ClientRun]:
    async with river.open_client(
        url,
        queues={
            "default": river.QueueConfig(max_workers=10),
            "billing": river.QueueConfig(max_workers=5),
            PAUSED_QUEUE: river.QueueConfig(max_workers=2),
        },
        workers=workers.registry(),
        retry_policy=_ChargeRetry(),
        soft_stop_timeout=1.0,  # the export runs until cancelled: a stop cancels it
        **CLIENT_OPTIONS,
    ) as run:
        yield run


async def _wait_for(sub: river.Subscription, ids: set[int]) -> dict[int, river.Event]:
    got: dict[int, river.Event] = {}
    with anyio.fail_after(30):
        async for event in sub:
            if event.job is not None and event.job.id in ids and event.job.id not in got:
                got[event.job.id] = event
                if len(got) == len(ids):
                    return got
    raise AssertionError(f"subscription ended; events for {sorted(got)} of {sorted(ids)}")


async def work_the_mix(run: river.ClientRun, workers: Workers, *, emails: int = 6) -> Mix:
    """Insert the mix into ``run``'s client and wait until every job has reached its state."""
    client = run.client
    await client.queues.pause(PAUSED_QUEUE)
    with run.subscribe() as sub:
        completed = [
            (await client.insert(SendEmail(to=f"user{i}@example.com"))).job.id
            for i in range(emails)
        ]
        retryable = (
            await client.insert(
                ChargeCard(customer="acme", amount_cents=4200),
                river.InsertOpts(queue="billing", tags=("payments",)),
            )
        ).job.id
        discarded = (
            await client.insert(
                ChargeCard(customer="globex", amount_cents=999),
                river.InsertOpts(queue="billing", max_attempts=1, tags=("payments",)),
            )
        ).job.id
        cancelled = (await client.insert(CloseAccount(customer="initech"))).job.id
        snoozed = (await client.insert(ResizeImage(path="/uploads/cat.png"))).job.id
        await _wait_for(sub, {*completed, retryable, discarded, cancelled, snoozed})
        running = (await client.insert(Export(since="2026-01-01"))).job.id
        with anyio.fail_after(30):
            await workers.started(running).wait()
    tomorrow = dt.datetime.now(dt.UTC) + dt.timedelta(days=1)
    scheduled = (
        await client.insert(MonthlyReport(month="2026-11"), river.InsertOpts(scheduled_at=tomorrow))
    ).job.id
    pending = (
        await client.insert(MonthlyReport(month="2026-12"), river.InsertOpts(pending=True))
    ).job.id
    available = [
        (
            await client.insert(
                MonthlyReport(month=f"2026-{m:02}"), river.InsertOpts(queue=PAUSED_QUEUE)
            )
        ).job.id
        for m in (8, 9, 10)
    ]
    return Mix(
        completed=completed,
        retryable=retryable,
        discarded=discarded,
        cancelled=cancelled,
        snoozed=snoozed,
        scheduled=scheduled,
        pending=pending,
        available=available,
        running=running,
    )
