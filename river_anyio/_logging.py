"""Logger names and the structured fields (``extra``) of river_anyio's log records.

river_anyio logs through fixed logger names under ``river_anyio`` (never ``__name__``, which
would leak private module paths into users' logs), installs no handlers and formats lazily.
Records about a job, a queue or a client carry stable fields, so log pipelines can filter
without parsing messages:

- ``river_event``: what happened, a stable snake_case name (``job_failed``, ``fetch_failed``…);
- ``river_client_id``: the client's ID;
- ``river_queue``: the queue;
- ``river_job_id``, ``river_job_kind``, ``river_attempt``: the job and its attempt;
- ``river_job_ids``: the jobs of a batch (the completer's records);
- ``river_service``: the leader's maintenance service (``maintenance_failed`` records).

The names and the fields are part of the public, documented surface (``docs/logging``).
"""

from __future__ import annotations

from typing import Any

from ._job import JobRow

__all__ = ["LOGGER_NAMES", "client_extra", "job_extra", "jobs_extra", "queue_extra"]

#: Every logger river_anyio writes to.
LOGGER_NAMES = (
    "river_anyio.client",
    "river_anyio.completer",
    "river_anyio.contrib.prometheus",
    "river_anyio.driver",
    "river_anyio.elector",
    "river_anyio.executor",
    "river_anyio.lease",
    "river_anyio.maintenance.job_cleaner",
    "river_anyio.maintenance.notification_cleaner",
    "river_anyio.maintenance.periodic",
    "river_anyio.maintenance.queue_cleaner",
    "river_anyio.maintenance.reindexer",
    "river_anyio.maintenance.rescuer",
    "river_anyio.maintenance.scheduler",
    "river_anyio.migrate",
    "river_anyio.notifier",
    "river_anyio.producer",
    "river_anyio.worker",
)


def client_extra(event: str, client_id: str | None) -> dict[str, Any]:
    """Fields of a record about a client as a whole."""
    return {"river_event": event, "river_client_id": client_id}


def queue_extra(event: str, queue: str, client_id: str | None) -> dict[str, Any]:
    """Fields of a record about one queue of a client."""
    return {"river_event": event, "river_client_id": client_id, "river_queue": queue}


def job_extra(event: str, row: JobRow, client_id: str | None) -> dict[str, Any]:
    """Fields of a record about one attempt of a job."""
    return {
        "river_event": event,
        "river_client_id": client_id,
        "river_queue": row.queue,
        "river_job_id": row.id,
        "river_job_kind": row.kind,
        "river_attempt": row.attempt,
    }


def jobs_extra(event: str, job_ids: list[int], client_id: str | None) -> dict[str, Any]:
    """Fields of a record about a batch of jobs."""
    return {"river_event": event, "river_client_id": client_id, "river_job_ids": job_ids}
