"""Testing support: assertions on inserted jobs and ways to run a worker in a test.

Plain async functions with no pytest dependency (the ``river_*`` pytest fixtures live in
:mod:`river_anyio.pytest_plugin`), usable under any test runner on trio or asyncio:

- :func:`require_inserted`, :func:`require_many_inserted`, :func:`require_not_inserted` and
  their ``_tx`` variants: River's ``rivertest.Require*`` assertions, raising
  :class:`RiverAssertionError` (an ``AssertionError``) with River's messages.
- :func:`work_once`: run a worker on a job built in memory (:func:`build_job`), no database.
- :func:`work_with_client`: insert a job, claim it as a producer would, run its worker with a
  real context and write the completion, all through a client.
- :func:`sqlite_test_database`, :func:`postgres_test_schema`: throwaway migrated databases
  (:class:`MigratedDatabase`).
"""

from __future__ import annotations

import contextlib

from ._database import MigratedDatabase as MigratedDatabase
from ._database import postgres_test_schema as postgres_test_schema
from ._database import sqlite_test_database as sqlite_test_database
from ._require import ExpectedJob as ExpectedJob
from ._require import RiverAssertionError as RiverAssertionError
from ._require import require_inserted as require_inserted
from ._require import require_inserted_tx as require_inserted_tx
from ._require import require_many_inserted as require_many_inserted
from ._require import require_many_inserted_tx as require_many_inserted_tx
from ._require import require_not_inserted as require_not_inserted
from ._require import require_not_inserted_tx as require_not_inserted_tx
from ._work import WorkResult as WorkResult
from ._work import build_job as build_job
from ._work import work_once as work_once
from ._work import work_with_client as work_with_client

__all__ = (
    "ExpectedJob",
    "MigratedDatabase",
    "RiverAssertionError",
    "WorkResult",
    "build_job",
    "postgres_test_schema",
    "require_inserted",
    "require_inserted_tx",
    "require_many_inserted",
    "require_many_inserted_tx",
    "require_not_inserted",
    "require_not_inserted_tx",
    "sqlite_test_database",
    "work_once",
    "work_with_client",
)


def _fixup_module_metadata() -> None:
    for name in __all__:
        obj = globals()[name]
        if getattr(obj, "__module__", "").startswith(__name__ + "._"):
            with contextlib.suppress(AttributeError, TypeError):
                obj.__module__ = __name__


_fixup_module_metadata()
del _fixup_module_metadata
