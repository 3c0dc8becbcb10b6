"""WAL checkpoints mostly on a thread of their own, off the commits' path.

SQLite checkpoints a WAL database from the commit that takes the WAL past 1,000 pages: that
commit copies the WAL's pages back into the database file and syncs it before it returns, 10
to 20 ms on a busy file (measured: one insert in about 130 stalled that long at 200 inserts a
second, and those stalls were the p99 of a job's pickup). The writer's connection gets a WAL
hook instead. After each commit it sees the WAL's size, and:

- once ``CHECKPOINT_PAGES`` pages have been added since the last copy, it wakes
  :class:`Checkpointer`, whose thread, with a connection of its own, runs a ``PASSIVE``
  checkpoint. That takes no lock a writer or reader waits for, and apsw releases the
  interpreter lock while SQLite copies, so the writer commits meanwhile;
- once the WAL has ``RESTART_PAGES`` and the thread has copied all but ``FINISH_PAGES`` of
  them, the committing connection copies the rest itself (a fraction of a millisecond), so the
  next commit starts the WAL over. A copy by another connection cannot do that: SQLite starts
  the WAL over only when a write begins with every page of it copied, which under a steady
  flow of commits the thread's copies never catch;
- and once the WAL has ``BEHIND_PAGES`` (the thread cannot keep up, or failed), the committing
  connection checkpoints whatever is left, as SQLite would have: the WAL stays bounded
  whatever happens to the thread.

The thread sleeps until a commit wakes it: an idle driver costs nothing, and the thread's
connection is opened on the first checkpoint. Only apsw connections to a file have the hook;
with a ``sqlite3``-API module, SQLite's own checkpoints remain.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import apsw

from ._connection import quote_ident

__all__ = ["BEHIND_PAGES", "CHECKPOINT_PAGES", "FINISH_PAGES", "RESTART_PAGES", "Checkpointer"]

logger = logging.getLogger("river_anyio.driver")

#: Pages added to the WAL since the last copy that wake the checkpointer's thread.
CHECKPOINT_PAGES = 500
#: A WAL this long (SQLite's default autocheckpoint) is finished by the committing connection
#: once no more than ``FINISH_PAGES`` of it are left to copy...
RESTART_PAGES = 1000
FINISH_PAGES = 64
#: ...and checkpointed by it whatever is left once it is this long.
BEHIND_PAGES = 4000


class Checkpointer:
    """Checkpoints one database's WAL (and its attached databases') as the writer's
    :meth:`wal_hook` decides (see the module docstring).

    Start it with :meth:`start`; :meth:`stop` asks the thread to end, and returns it to join.
    """

    def __init__(
        self,
        path: str,
        *,
        attach: Mapping[str, str] | None = None,
        name: str = "river-sqlite-checkpointer",
        checkpoint_pages: int = CHECKPOINT_PAGES,
        restart_pages: int = RESTART_PAGES,
        finish_pages: int = FINISH_PAGES,
        behind_pages: int = BEHIND_PAGES,
    ) -> None:
        self.path = path
        self._attach = dict(attach or {})
        self._name = name
        self._checkpoint_pages = checkpoint_pages
        self._restart_pages = restart_pages
        self._finish_pages = finish_pages
        self._behind_pages = behind_pages
        #: per database (``main`` or an attached one): the WAL's pages its last checkpoint
        #: copied (written by either thread, each write one dict item under the interpreter
        #: lock), and the databases the thread is to checkpoint (under ``_wake``, which
        #: commits and stop() notify)
        self._copied: dict[str, int] = {}
        self._wanted: set[str] = set()
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: checkpoints run by the thread (notified under ``_ran``), and by committing
        #: connections (finishing the WAL, or the thread was behind)
        self._ran = threading.Condition()
        self.checkpoints = 0
        self.in_commits = 0
        #: the thread's last checkpoint: (database, (pages in the WAL, pages copied))
        self.last: tuple[str, tuple[int, int]] | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> threading.Thread | None:
        """Ask the thread to end (after the checkpoint it may be running); returns it, for
        the caller to join outside the event loop."""
        with self._wake:
            self._stop.set()
            self._wake.notify()
        thread, self._thread = self._thread, None
        return thread

    def wait_checkpoints(self, count: int, timeout: float) -> bool:
        """Block until the thread has run ``count`` checkpoints (False after ``timeout``)."""
        with self._ran:
            return self._ran.wait_for(lambda: self.checkpoints >= count, timeout)

    def wal_hook(self, conn: apsw.Connection, dbname: str, pages: int) -> int:
        """The writer's WAL hook: called by SQLite on the writer's thread after each commit,
        with the WAL's size in pages."""
        copied = self._copied.get(dbname, 0)
        if pages < copied:  # the WAL has started over since
            copied = 0
        left = pages - copied
        if left >= self._checkpoint_pages:
            with self._wake:
                self._wanted.add(dbname)
                self._wake.notify()
        if pages >= self._restart_pages and (
            left <= self._finish_pages or pages >= self._behind_pages
        ):
            try:
                _, self._copied[dbname] = conn.wal_checkpoint(
                    dbname, apsw.SQLITE_CHECKPOINT_PASSIVE
                )
                self.in_commits += 1
            except apsw.BusyError:
                pass  # a checkpoint is running (the thread's): a later commit tries again
            except apsw.Error as exc:
                logger.warning("sqlite: checkpoint of a %d-page WAL failed: %s", pages, exc)
        return apsw.SQLITE_OK

    # ---- thread side ----------------------------------------------------------------------

    def _main(self) -> None:
        conn: apsw.Connection | None = None
        try:
            while True:
                with self._wake:
                    self._wake.wait_for(lambda: self._wanted or self._stop.is_set())
                    if self._stop.is_set():
                        return
                    wanted, self._wanted = self._wanted, set()
                for dbname in sorted(wanted):
                    try:
                        if conn is None:
                            conn = self._open()
                        result = conn.wal_checkpoint(dbname, apsw.SQLITE_CHECKPOINT_PASSIVE)
                    except apsw.BusyError:
                        continue  # another connection is checkpointing: a commit asks again
                    except apsw.Error as exc:
                        # a commit asks again; from BEHIND_PAGES commits checkpoint themselves
                        logger.warning("sqlite: checkpoint of %s failed: %s", dbname, exc)
                        continue
                    self._copied[dbname] = result[1]
                    self.last = (dbname, result)
                    with self._ran:
                        self.checkpoints += 1
                        self._ran.notify_all()
        finally:
            if conn is not None:
                try:
                    conn.close()
                except apsw.Error as exc:  # pragma: no cover - close errors are unexpected
                    logger.warning("sqlite: error closing the checkpointer: %r", exc)

    def _open(self) -> apsw.Connection:
        conn = apsw.Connection(self.path, flags=apsw.SQLITE_OPEN_READWRITE)
        try:
            for name, path in self._attach.items():
                conn.execute(f"ATTACH DATABASE ? AS {quote_ident(name)}", (path,))
            # a connection opens a database's WAL with its first read of it, not before:
            # until then it has nothing to checkpoint
            for schema in ("main", *self._attach):
                conn.execute(f"SELECT count(*) FROM {quote_ident(schema)}.sqlite_schema").fetchall()
        except BaseException:
            conn.close()
            raise
        return conn
