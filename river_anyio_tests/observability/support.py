"""Helpers for the observability tests: a log handler that can be awaited, and real faults
that make claims fail."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator

import anyio

from ..runtime.lifecycle_support import SOON, is_postgres, other_driver


class RecordsHandler(logging.Handler):
    """Collects records and wakes waiters; records arrive on the event loop's thread (the
    runtime logs from its tasks), so an AnyIO event can be set directly."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._changed = anyio.Event()

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)
        self._changed.set()

    def of(self, event: str) -> list[logging.LogRecord]:
        return [r for r in self.records if getattr(r, "river_event", None) == event]

    async def wait_for(
        self, event: str, where: Callable[[logging.LogRecord], bool] = lambda r: True
    ) -> logging.LogRecord:
        """The first record of ``event`` matching ``where`` (waits for it)."""
        with anyio.fail_after(SOON):
            while True:
                for record in self.of(event):
                    if where(record):
                        return record
                self._changed = anyio.Event()
                await self._changed.wait()


@contextlib.contextmanager
def capture(logger: str = "river_anyio") -> Iterator[RecordsHandler]:
    handler = RecordsHandler()
    log = logging.getLogger(logger)
    old_level = log.level
    log.setLevel(logging.DEBUG)
    log.addHandler(handler)
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)


_REFUSE_CLAIMS_PG = """
CREATE FUNCTION river_test_refuse_claims() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'river_test: claims are refused';
END $$;
CREATE TRIGGER river_test_refuse_claims BEFORE UPDATE ON river_job
    FOR EACH ROW WHEN (OLD.state = 'available' AND NEW.state = 'running')
    EXECUTE FUNCTION river_test_refuse_claims();
"""
_REFUSE_CLAIMS_SQLITE = """
CREATE TRIGGER river_test_refuse_claims BEFORE UPDATE ON river_job
    FOR EACH ROW WHEN OLD.state = 'available' AND NEW.state = 'running'
    BEGIN SELECT RAISE(ABORT, 'river_test: claims are refused'); END;
"""


async def refuse_claims(url: str) -> None:
    """Make every claim of an available job fail (a real database error in the fetch)."""
    async with other_driver(url) as driver:
        await driver.executor().exec_script(
            _REFUSE_CLAIMS_PG if is_postgres(url) else _REFUSE_CLAIMS_SQLITE
        )
