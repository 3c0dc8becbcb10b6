"""River's SQLite notifications: following the ``river_notification`` outbox.

SQLite has no LISTEN/NOTIFY, so senders append rows to ``river_notification`` inside their
transaction and listeners read rows past a cursor. The cursor starts at ``max(id)`` when the
listener connects (no replay of history); each topic also remembers ``max(id)`` when it was
subscribed. Because SQLite serialises writers, ids become visible in increasing order, so the
cursor never skips a row.

When to read: a commit in this process pokes the listener (the driver calls :meth:`poke`); a
commit by any other connection (another process on the same file) is noticed without a SQL
statement, so an idle listener runs none. The truth is the WAL index header (the first 48 bytes
of the ``-shm`` file, whose change counter SQLite increments with every transaction,
https://www.sqlite.org/walformat.html): the reader thread reads it (one ``pread``) and runs the
outbox query only when it changed. When it reads it:

- on Linux, when an inotify watch on the ``-wal`` file fires (every commit writes that file;
  a checkpoint that truncates it, or a restart of the log from its start, too) and
  :data:`COALESCE` later (the commit's other frames and its header written by then), then every
  :data:`SETTLE` for a short while (the header is written just after the frames), and
  otherwise every :data:`IDLE_CHECK`: an idle listener wakes once a second and runs no SQL;
- elsewhere, every :data:`WATCH_INTERVAL`, River's poll interval;
- without a WAL to watch (another journal mode, the in-memory database) the outbox itself is
  polled every :data:`POLL_INTERVAL`, as River's SQLite listener does.

Commits of this process's own writer connection change the header too, but need no read:
their notifications poke the listener. :class:`OwnCommits` proves which change counters were
the writer's own (see there), and a change made only of those is accounted for without SQL.
Reads caused by other changes are at least :data:`READ_SPACING` apart. The reader thread
waits in ``select()`` on the inotify descriptor and a pipe that a poke (or a cancellation)
writes to, so neither waits for a tick.

Reads run on the listener's own read-only connection (WAL readers never wait for the writer),
in its own thread, so they neither queue behind the writer's work nor delay it.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import functools
import json
import os
import select
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Final

import anyio
import apsw

from ..._errors import ConnectionLostError
from .._protocol import Notification
from ._connection import quote_ident

if TYPE_CHECKING:
    from ._connection import ConnectionThread
    from ._queries import Queries

__all__ = [
    "IDLE_CHECK",
    "POLL_INTERVAL",
    "READ_SPACING",
    "WATCH_INTERVAL",
    "OwnCommits",
    "SQLiteListener",
]

#: Poll interval without a WAL index to watch, as River's SQLite listener.
POLL_INTERVAL: Final = 0.05
#: Without inotify: how often the reader thread reads the WAL index header (River's poll).
WATCH_INTERVAL: Final = 0.05
#: With inotify: how often it reads it anyway (a commit whose header update came late).
IDLE_CHECK: Final = 1.0
#: After the ``-wal`` file was written: read the header this often, SETTLE_TICKS times.
SETTLE: Final = 0.002
SETTLE_TICKS: Final = 25
#: The least time from one outbox read to the next caused by a change (not by a poke): at
#: most 500 a second, the bound PostgreSQL's insert notifications have per queue and inserting
#: client. (At 5 ms, jobs inserted by another process 200 times a second waited for the
#: spacing: pickup p50 4.0 ms, against 1.8 at 2 ms.)
READ_SPACING: Final = 0.002
#: After an inotify event: how long to let the commit that caused it finish before reading
#: the header. A commit writes its frames to the ``-wal`` file one by one, each an event; woken
#: by the first, the thread found the header not yet written and woke again for each frame
#: (about 2,000 times a second at 200 commits a second from another process, against 650 now)
#: and waited for :data:`SETTLE` ticks: pickup p50 1.9–2.1 ms, now 1.5–1.6.
COALESCE: Final = 0.0001
#: A watch returns to the event loop at least this often (without reading the outbox).
_WATCH_MAX: Final = 30.0
_BATCH: Final = 256
_HEADER: Final = 48  # one copy of the WAL index header
_COUNTER: Final = struct.Struct("=I")  # its change counter (iChange), at offset 8, native order
#: Change counters proven this writer's own that are remembered (the listener looks at the
#: newest few: it reads the header within milliseconds of each commit).
_OWN_SPANS: Final = 1024


Rows = list[tuple[int, str, str]]


def _op_last_id(conn: apsw.Connection, sql: str) -> int:
    row = conn.execute(sql).fetchone()
    return int(row[0]) if row else 0


def _op_after(conn: apsw.Connection, sql: str, after: int, topics: str, limit: int) -> Rows:
    return [(int(i), str(t), str(p)) for i, t, p in conn.execute(sql, (after, topics, limit))]


_IN_MODIFY: Final = 0x2
_IN_GONE: Final = 0x400 | 0x800 | 0x8000  # IN_DELETE_SELF, IN_MOVE_SELF, IN_IGNORED
_IN_NONBLOCK: Final = 0o4000
_IN_CLOEXEC: Final = 0o2000000
_EVENT: Final = struct.Struct("iIII")  # struct inotify_event without its name


def _inotify_on(path: str) -> int | None:
    """A non-blocking inotify descriptor reporting writes to ``path``; None where there is no
    inotify (not Linux) or it cannot be had (no instance left, no such file)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        init, add = libc.inotify_init1, libc.inotify_add_watch
    except (OSError, AttributeError):
        return None
    init.argtypes, init.restype = [ctypes.c_int], ctypes.c_int
    add.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
    add.restype = ctypes.c_int
    fd = int(init(_IN_NONBLOCK | _IN_CLOEXEC))
    if fd < 0:
        return None
    if add(fd, os.fsencode(path), _IN_MODIFY | 0x400 | 0x800) < 0:
        os.close(fd)
        return None
    return fd


def _open_wal_index(conn: apsw.Connection, schema: str | None) -> int | None:
    """A read-only descriptor on the WAL index (``-shm``) of the database holding the
    outbox, or None when it is not in WAL mode or is not a file."""
    name = schema or "main"
    if not hasattr(os, "pread"):
        return None
    row = conn.execute(f"PRAGMA {quote_ident(name)}.journal_mode").fetchone()
    if not row or str(row[0]).lower() != "wal":
        return None
    path = conn.db_filename(name)
    if not path:
        return None
    try:
        return os.open(path + "-shm", os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None


def _change_counter(both: bytes) -> int | None:
    """The change counter of a read of the header's two copies, or None when they differ (a
    writer is between its two copies: the read says nothing)."""
    if len(both) != 2 * _HEADER or both[:_HEADER] != both[_HEADER:]:
        return None
    value: int = _COUNTER.unpack_from(both, 8)[0]
    return value


class OwnCommits:
    """Which of the WAL index's change counters the driver's writer connection produced, so
    the listener's watch accounts for those commits without reading the outbox.

    SQLite adds one to the counter with every commit. ``PRAGMA data_version`` changes only
    when *another* connection committed. The writer's thread reads the counter before and
    after each unit of work, and data_version before the unit (taken again only when the
    counter moved since the last unit: someone else committed) and after it (only when the
    counter moved during it). When data_version did not change from before the unit to after
    it, every commit between the unit's two counters was its own: another connection's commit
    in between would have changed it. The worst a race costs is a read. A unit that commits
    nothing runs no statement for this.
    """

    def __init__(self, shm: int, schema: str | None) -> None:
        self._shm = shm
        self._pragma = f"PRAGMA {quote_ident(schema or 'main')}.data_version"
        self._lock = threading.Lock()
        self._spans: dict[int, int] = {}  # counter before -> counter after, oldest first
        self._version: int | None = None  # data_version, taken before ...
        self._at = -1  # ... this counter was read (the last unit's end or this one's start)
        self._begun = -1  # the counter as the unit under way began
        self._running = False  # a unit of work is under way on the writer
        self._waiting: list[Callable[[], object]] = []  # watches told to wait for its end

    @classmethod
    def open(cls, conn: apsw.Connection, schema: str | None) -> OwnCommits | None:
        """On the writer's thread; None when there is no WAL index to follow."""
        shm = _open_wal_index(conn, schema)
        return None if shm is None else cls(shm, schema)

    def _counter(self) -> int:
        try:
            value = _change_counter(os.pread(self._shm, 2 * _HEADER, 0))
        except OSError:
            value = None
        return -1 if value is None else value

    def _data_version(self, conn: apsw.Connection) -> int | None:
        try:
            row = conn.execute(self._pragma).fetchone()
        except Exception:  # interrupted, say: prove nothing this time
            return None
        return None if row is None else int(row[0])

    # ---- the writer's thread

    def unit_begins(self, conn: apsw.Connection) -> None:
        self._running = True
        counter = self._counter()
        if counter < 0 or counter != self._at or self._version is None:
            # someone else committed since the last unit (or nothing is known yet)
            self._version = self._data_version(conn)
            counter = self._counter()
        self._begun = self._at = counter

    def unit_ends(self, conn: apsw.Connection) -> None:
        """Record the unit's commits as its own if no other connection committed meanwhile."""
        end = self._counter()
        begun = self._begun
        span = False
        if end >= 0 and begun >= 0 and end != begun:
            version = self._data_version(conn)
            span = version is not None and version == self._version and end > begun
            self._version = version
        self._at = end
        with self._lock:
            self._running = False
            waiting, self._waiting = self._waiting, []
            if span:
                self._spans[begun] = end
                if len(self._spans) > _OWN_SPANS:
                    del self._spans[next(iter(self._spans))]
        for wake in waiting:
            wake()

    # ---- the listener's thread

    def explains(self, seen: int, now: int, wake: Callable[[], object]) -> bool | None:
        """True if every commit from counter ``seen`` to ``now`` was the writer's own; None if
        not (yet) but a unit is under way, whose end calls ``wake``; else False."""
        with self._lock:
            at = seen
            while at < now:
                nxt = self._spans.get(at)
                if nxt is None:
                    break
                at = nxt
            if at == now:
                return True
            if self._running:
                self._waiting.append(wake)
                return None
            return False

    def close(self) -> None:
        os.close(self._shm)


class _WalIndexWatch:
    """What tells the listener that the database holding the outbox changed: its WAL index
    header (the ``-shm`` file), an inotify descriptor on its ``-wal`` file (Linux) and a pipe
    that wakes the reader thread. Everything but :meth:`wake` runs in the reader thread."""

    def __init__(self, shm: int, inotify: int | None) -> None:
        self._shm = shm
        self.inotify = inotify
        self._wake_r, self._wake_w = os.pipe()
        for fd in (self._wake_r, self._wake_w):
            os.set_blocking(fd, False)
            os.set_inheritable(fd, False)
        self._seen = b""
        self._head = b""
        #: The driver writer's own commits, accounted for without a read (None: every change
        #: is read).
        self.own: OwnCommits | None = None

    @classmethod
    def open(cls, conn: apsw.Connection, schema: str | None) -> _WalIndexWatch | None:
        """A watch on the database holding the outbox, or None when there is nothing to watch."""
        shm = _open_wal_index(conn, schema)
        if shm is None:
            return None
        watch = cls(shm, _inotify_on(conn.db_filename(schema or "main") + "-wal"))
        watch.pending()
        watch.seen()
        return watch

    def pending(self) -> bool:
        """Whether the header differs from the one last marked :meth:`seen` (True if it
        cannot be read: then only the outbox can tell)."""
        try:
            self._head = os.pread(self._shm, 2 * _HEADER, 0)
        except OSError:
            self._head = b""
            return True
        return self._head[:_HEADER] != self._seen[:_HEADER]

    def seen(self) -> None:
        """The header last read is accounted for (the outbox is about to be read)."""
        self._seen = self._head

    def explained(self) -> bool | None:
        """After :meth:`pending`: True if the change was the writer's own commits only (then it
        is marked seen); None if that may be so once the writer's unit under way ends (which
        wakes :meth:`wait`); False if the outbox must be read."""
        own = self.own
        if own is None:
            return False
        before, after = _change_counter(self._seen), _change_counter(self._head)
        if before is None or after is None:
            return False
        verdict = own.explains(before, after, self.wake)
        if verdict:
            self.seen()
        return verdict

    def wake(self) -> None:
        """Wake the reader thread's :meth:`wait` (from any thread; never blocks)."""
        with contextlib.suppress(OSError):  # a full pipe is awake already
            os.write(self._wake_w, b"!")

    def wait(self, timeout: float) -> bool:
        """Sleep until woken, the ``-wal`` file is written or ``timeout``; True if written."""
        fds = [self._wake_r] if self.inotify is None else [self._wake_r, self.inotify]
        ready, _, _ = select.select(fds, [], [], max(timeout, 0.0))
        if self.inotify is not None and self.inotify in ready and self._wake_r not in ready:
            # let the commit write its last frames and the header, then take its events at once
            woken, _, _ = select.select([self._wake_r], [], [], COALESCE)
            ready = ready + woken
        if self._wake_r in ready:
            with contextlib.suppress(OSError):
                while os.read(self._wake_r, 4096):
                    pass
        return self.inotify is not None and self.inotify in ready and self._drain()

    def _drain(self) -> bool:
        """Consume the inotify events; if the ``-wal`` file went away (deleted or renamed),
        give inotify up (the header is still read every :data:`WATCH_INTERVAL`)."""
        fd = self.inotify
        assert fd is not None
        gone = False
        while True:
            try:
                data = os.read(fd, 4096)
            except BlockingIOError:
                break
            except OSError:
                gone = True
                break
            if not data:
                break
            pos = 0
            while pos + _EVENT.size <= len(data):
                _wd, mask, _cookie, length = _EVENT.unpack_from(data, pos)
                gone = gone or bool(mask & _IN_GONE)
                pos += _EVENT.size + length
        if gone:
            self.inotify = None
            os.close(fd)
        return True

    def close(self) -> None:
        for fd in (self._shm, self._wake_r, self._wake_w, self.inotify):
            if fd is not None:
                os.close(fd)
        self.inotify = None


def _op_watch(conn: apsw.Connection, schema: str | None) -> _WalIndexWatch | None:
    return _WalIndexWatch.open(conn, schema)


def _op_close_watch(conn: apsw.Connection, watch: _WalIndexWatch) -> None:
    watch.close()


def _op_follow(
    conn: apsw.Connection,
    query: Callable[[apsw.Connection], Rows],
    watch: _WalIndexWatch,
    look_first: bool,
    poked: threading.Event,
    cancelled: threading.Event,
) -> Rows | None:
    """Wait in the reader thread until there are rows to deliver or the loop must look.

    Returns the rows found after a change of the WAL index header (or at once when
    ``look_first``); the rows (maybe none) after a poke; None when cancelled or after
    :data:`_WATCH_MAX` without rows.
    """
    now = time.monotonic()
    deadline = now + _WATCH_MAX
    next_read = now
    look = look_first
    settle = 0
    written = False
    hold_until = 0.0  # waiting for the writer's unit under way, to learn if it was its commit
    while True:
        if poked.is_set():
            poked.clear()
            watch.pending()
            watch.seen()  # the query below sees whatever this commit was
            return query(conn)
        now = time.monotonic()
        due = watch.pending() or look  # always read: seen() records this header
        own = False
        if due and not look:
            verdict = watch.explained()
            if verdict:
                due, own = False, True  # only this process's writer committed: nothing to find
            elif verdict is None:
                hold_until = hold_until or now + SETTLE
                if now < hold_until:
                    written = False
                    watch.wait(hold_until - now)
                    continue
            hold_until = 0.0
        if written:
            # the -wal file was written but the header not yet: a commit is under way
            settle = 0 if due or own else SETTLE_TICKS
            written = False
        if due and now >= next_read:
            look = False
            watch.seen()
            rows = query(conn)
            if rows:
                return rows
            now = time.monotonic()
            next_read = now + READ_SPACING
            due = False
        if cancelled.is_set() or now >= deadline:
            return None
        timeout = WATCH_INTERVAL if watch.inotify is None else (SETTLE if settle else IDLE_CHECK)
        if due:
            timeout = min(timeout, next_read - now)
        written = watch.wait(timeout)
        if settle and not written:
            settle -= 1


class SQLiteListener:
    """Notifications from River's SQLite outbox; iterate with ``async for``.

    Only topics passed to :meth:`listen` are delivered, and only rows committed after the
    listener connected (and after that topic was subscribed).
    """

    def __init__(
        self, reader: ConnectionThread, queries: Queries, *, poll_interval: float = POLL_INTERVAL
    ) -> None:
        self._reader = reader
        self._q = queries
        self._poll_interval = poll_interval
        self._last_id = 0
        self._topics: dict[str, int] = {}  # topic -> max(id) when subscribed
        self._pending: collections.deque[tuple[int, str, str]] = collections.deque()
        self._wake = anyio.Event()
        self._poked = threading.Event()  # the same "look now", for the reader thread's watch
        self._watch: _WalIndexWatch | None = None
        self._look = True  # read the outbox before watching (first, or a full batch came back)
        self._closed = False

    async def connect(self) -> None:
        """Remember where the outbox ends now: earlier rows are never delivered."""
        self._last_id = await self._reader.run(_op_last_id, self._q.notification_last_id)
        self._watch = await self._reader.run(_op_watch, self._q.schema)
        if self._watch is not None:
            self._reader.cancel_hook = self._watch.wake

    def own_commits(self, own: OwnCommits) -> None:
        """Account for the driver writer's own commits without reading the outbox."""
        if self._watch is not None:
            self._watch.own = own

    @property
    def watching(self) -> bool:
        """Whether commits are noticed through the WAL index (else the outbox is polled)."""
        return self._watch is not None

    async def listen(self, topic: str) -> None:
        if topic in self._topics:
            return
        self.poke()  # a watch in progress gives the reader thread back
        current = await self._reader.run(_op_last_id, self._q.notification_last_id)
        # Not the global cursor: rows of other topics up to `current` may still be pending.
        self._topics[topic] = max(self._last_id, current)
        self.poke()

    async def unlisten(self, topic: str) -> None:
        self._topics.pop(topic, None)

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(self._topics)

    def poke(self) -> None:
        """Read the outbox now rather than at the next look (a notification was just committed)."""
        self._wake.set()
        self._poked.set()
        if self._watch is not None:
            self._watch.wake()

    async def aclose(self) -> None:
        self._closed = True
        self.poke()
        watch, self._watch = self._watch, None
        self._reader.cancel_hook = None  # the watch's descriptors are closed below
        with anyio.CancelScope(shield=True):
            if watch is not None:
                try:
                    await self._reader.run(_op_close_watch, watch)
                except ConnectionLostError:
                    watch.close()  # no thread left to wait on these descriptors
            await self._reader.aclose()

    def __aiter__(self) -> SQLiteListener:
        return self

    async def __anext__(self) -> Notification:
        while True:
            while self._pending:
                row_id, topic, payload = self._pending.popleft()
                start = self._topics.get(topic)
                if start is not None and row_id > start:
                    return Notification(topic=topic, payload=payload)
            if self._closed:
                raise StopAsyncIteration
            if not self._topics:
                await self._wake.wait()  # nothing to read for until listen()
                self._wake = anyio.Event()
                continue
            try:
                rows = await self._next_rows()
            except ConnectionLostError:
                if self._closed:
                    raise StopAsyncIteration from None
                raise
            if rows:
                self._pending.extend(rows)
                self._last_id = rows[-1][0]

    async def _next_rows(self) -> Rows:
        query = functools.partial(
            _op_after,
            sql=self._q.notification_after,
            after=self._last_id,
            topics=json.dumps(list(self._topics)),
            limit=_BATCH,
        )
        watch = self._watch
        if watch is not None:
            found = await self._reader.run(
                _op_follow, query, watch, self._look, self._poked, self._reader.cancel_requested
            )
            # A read covers every commit up to the header it marked seen, so watching the
            # header again is enough, unless the read stopped at its batch size.
            self._look = found is not None and len(found) >= _BATCH
            return found or []
        rows = await self._reader.run(query)
        if not rows:
            with anyio.move_on_after(self._poll_interval):
                await self._wake.wait()
            self._wake = anyio.Event()
        return rows
