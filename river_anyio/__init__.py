"""river_anyio: River's background-job system for Python, on trio or asyncio.

River's schema, unique keys and notifications, shared with River's Go, Rust and JS clients,
on PostgreSQL or an embedded SQLite file. Everything public is re-exported here; the modules
behind it are private.
"""

from __future__ import annotations

import contextlib

from ._client import Client as Client
from ._config import Config as Config
from ._config import ConfigOptions as ConfigOptions
from ._config import MaintenanceConfig as MaintenanceConfig
from ._config import QueueConfig as QueueConfig
from ._cron import CronSchedule as CronSchedule
from ._cron import cron as cron
from ._errors import ClientCrashedError as ClientCrashedError
from ._errors import ConfigError as ConfigError
from ._errors import ConnectionLostError as ConnectionLostError
from ._errors import CronError as CronError
from ._errors import DatabaseBusyError as DatabaseBusyError
from ._errors import DatabaseError as DatabaseError
from ._errors import IntegrityError as IntegrityError
from ._errors import JobRunningError as JobRunningError
from ._errors import JobWaitTimeoutError as JobWaitTimeoutError
from ._errors import LeaseLostError as LeaseLostError
from ._errors import MigrationError as MigrationError
from ._errors import NotFoundError as NotFoundError
from ._errors import PoolTimeoutError as PoolTimeoutError
from ._errors import QueryCanceledError as QueryCanceledError
from ._errors import RiverError as RiverError
from ._errors import UniqueViolationError as UniqueViolationError
from ._errors import ValidationError as ValidationError
from ._events import Event as Event
from ._events import EventKind as EventKind
from ._events import JobTimings as JobTimings
from ._events import Subscription as Subscription
from ._health import Health as Health
from ._health import HealthConfig as HealthConfig
from ._health import QueueHealth as QueueHealth
from ._insert import InsertManyParams as InsertManyParams
from ._job import AttemptError as AttemptError
from ._job import InsertOpts as InsertOpts
from ._job import InsertResult as InsertResult
from ._job import JobArgs as JobArgs
from ._job import JobRow as JobRow
from ._job import JobState as JobState
from ._job import UniqueOpts as UniqueOpts
from ._jobs_api import JobListCursor as JobListCursor
from ._jobs_api import JobListOptions as JobListOptions
from ._jobs_api import JobListResult as JobListResult
from ._jobs_api import JobsAPI as JobsAPI
from ._lease import Lease as Lease
from ._periodic import IntervalSchedule as IntervalSchedule
from ._periodic import PeriodicJob as PeriodicJob
from ._periodic import PeriodicJobHandle as PeriodicJobHandle
from ._periodic import PeriodicJobs as PeriodicJobs
from ._periodic import PeriodicJobsStartParams as PeriodicJobsStartParams
from ._periodic import PeriodicSchedule as PeriodicSchedule
from ._periodic import every as every
from ._queue_limits import RateLimit as RateLimit
from ._queues_api import LocalQueues as LocalQueues
from ._queues_api import QueuesAPI as QueuesAPI
from ._resumable import ResumableStepError as ResumableStepError
from ._retry import DefaultRetryPolicy as DefaultRetryPolicy
from ._retry import RetryPolicy as RetryPolicy
from ._runtime._entry import open_client as open_client
from ._runtime._entry import run_client as run_client
from ._runtime._supervisor import ClientRun as ClientRun
from ._runtime._supervisor import Diagnostics as Diagnostics
from ._version import __version__ as __version__
from ._work import Job as Job
from ._work import Outcome as Outcome
from ._work import WorkContext as WorkContext
from ._work import Worker as Worker
from ._work import Workers as Workers
from ._work import cancel as cancel
from ._work import discard as discard
from ._work import snooze as snooze

__all__ = (
    "AttemptError",
    "Client",
    "ClientCrashedError",
    "ClientRun",
    "Config",
    "ConfigError",
    "ConfigOptions",
    "ConnectionLostError",
    "CronError",
    "CronSchedule",
    "DatabaseBusyError",
    "DatabaseError",
    "DefaultRetryPolicy",
    "Diagnostics",
    "Event",
    "EventKind",
    "Health",
    "HealthConfig",
    "InsertManyParams",
    "InsertOpts",
    "InsertResult",
    "IntegrityError",
    "IntervalSchedule",
    "Job",
    "JobArgs",
    "JobListCursor",
    "JobListOptions",
    "JobListResult",
    "JobRow",
    "JobRunningError",
    "JobState",
    "JobTimings",
    "JobWaitTimeoutError",
    "JobsAPI",
    "Lease",
    "LeaseLostError",
    "LocalQueues",
    "MaintenanceConfig",
    "MigrationError",
    "NotFoundError",
    "Outcome",
    "PeriodicJob",
    "PeriodicJobHandle",
    "PeriodicJobs",
    "PeriodicJobsStartParams",
    "PeriodicSchedule",
    "PoolTimeoutError",
    "QueryCanceledError",
    "QueueConfig",
    "QueueHealth",
    "QueuesAPI",
    "RateLimit",
    "ResumableStepError",
    "RetryPolicy",
    "RiverError",
    "Subscription",
    "UniqueOpts",
    "UniqueViolationError",
    "ValidationError",
    "WorkContext",
    "Worker",
    "Workers",
    "__version__",
    "cancel",
    "cron",
    "discard",
    "every",
    "open_client",
    "run_client",
    "snooze",
)


def _fixup_module_metadata() -> None:
    # Tracebacks and docs should say river_anyio.Client, not river_anyio._client.Client.
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith("river_anyio._"):
            with contextlib.suppress(AttributeError, TypeError):  # read-only objects
                obj.__module__ = __name__


_fixup_module_metadata()
del _fixup_module_metadata
