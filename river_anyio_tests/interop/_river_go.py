"""Drive the real River Go library (the program in ``go/``) from the interop tests.

The program is built once per source version into a cache directory keyed by a hash of its
``go.mod``, ``go.sum``, ``*.go`` files and the Go version, so later sessions start at once.
``python -m river_anyio_tests.interop._go_build`` builds it ahead of a test run (CI does, so
the first compile, a few minutes on a fresh machine, is not charged to a test's timeout).

One-shot subcommands print one JSON document; ``run`` prints one JSON object per line, which
:class:`GoRun` collects in the background so tests wait for a line, never sleep.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from ._go_build import GO_DIR, REQUIRE_ENV, RIVER_VERSION, GoError, build, go_binary

__all__ = [
    "GO_DIR",
    "REQUIRE_ENV",
    "RIVER_VERSION",
    "GoError",
    "GoRun",
    "RiverGo",
    "build",
    "go_binary",
]


def _cmd(binary: Path, command: str, url: str, flags: tuple[str, ...]) -> list[str]:
    return [str(binary), command, "-url", url, *flags]


def _parse(command: str, rc: int, stdout: bytes, stderr: bytes) -> Any:
    if rc != 0:
        raise GoError(f"river go {command} failed (exit {rc}): {stderr.decode(errors='replace')}")
    return json.loads(stdout)


class RiverGo:
    """The built program, with helpers to call it."""

    def __init__(self, binary: Path) -> None:
        self.binary = binary

    def call_sync(self, command: str, url: str, *flags: str, stdin: Any = None) -> Any:
        data = json.dumps(stdin).encode() if stdin is not None else b""
        proc = subprocess.run(
            _cmd(self.binary, command, url, flags), input=data, capture_output=True, timeout=60
        )
        return _parse(command, proc.returncode, proc.stdout, proc.stderr)

    async def call(self, command: str, url: str, *flags: str, stdin: Any = None) -> Any:
        data = json.dumps(stdin).encode() if stdin is not None else b""
        with anyio.fail_after(60):
            proc = await anyio.run_process(
                _cmd(self.binary, command, url, flags), input=data, check=False
            )
        return _parse(command, proc.returncode, proc.stdout, proc.stderr)

    @contextlib.asynccontextmanager
    async def run(
        self,
        url: str,
        *,
        queues: dict[str, int],
        kinds: list[str],
        client_id: str | None = None,
        fetch_only_known_kinds: bool = False,
        leader_election_disabled: bool = False,
        report_leader: bool = False,
        tz: str = "Asia/Kolkata",
    ) -> AsyncIterator[GoRun]:
        """A River Go client working ``queues`` with the program's scripted worker for
        ``kinds``; stopped gracefully when the block ends. The process runs in time zone
        ``tz`` (River Go writes some timestamps in local time: a non-UTC zone tests that
        river_anyio reads them right)."""
        flags = ["-queues", ",".join(f"{q}:{n}" for q, n in queues.items())]
        flags += ["-kinds", ",".join(kinds)]
        if client_id:
            flags += ["-client-id", client_id]
        if fetch_only_known_kinds:
            flags.append("-fetch-only-known-kinds")
        if leader_election_disabled:
            flags.append("-leader-election-disabled")
        if report_leader:
            flags.append("-report-leader")
        with tempfile.TemporaryFile() as stderr:
            proc = await anyio.open_process(
                _cmd(self.binary, "run", url, tuple(flags)),
                stderr=stderr,
                env={**os.environ, "TZ": tz},
            )
            run = GoRun(proc, stderr)
            try:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(run._read)
                    try:
                        await run.wait_for("started")
                        yield run
                        await run.stop()
                    finally:
                        tg.cancel_scope.cancel("go run over")
            except BaseExceptionGroup as group:
                if len(group.exceptions) == 1:  # the body's own failure, as itself
                    raise group.exceptions[0] from None
                raise
            finally:
                with anyio.CancelScope(shield=True):
                    if proc.returncode is None:
                        proc.kill()
                    await proc.aclose()


class GoRun:
    """A running ``run`` subcommand: every line it printed, in ``lines``."""

    def __init__(self, proc: anyio.abc.Process, stderr: Any) -> None:
        self._proc = proc
        self._stderr = stderr
        self.lines: list[dict[str, Any]] = []
        self._changed = anyio.Event()
        self._eof = False

    @property
    def client_id(self) -> str:
        return str(self.find("started")[0]["client_id"])

    def stderr_text(self) -> str:
        self._stderr.seek(0)
        return str(self._stderr.read().decode(errors="replace"))[-4000:]

    async def _read(self) -> None:
        assert self._proc.stdout is not None
        stream = BufferedByteReceiveStream(self._proc.stdout)
        try:
            while True:
                line = await stream.receive_until(b"\n", 1 << 24)
                self.lines.append(json.loads(line))
                self._changed.set()
                self._changed = anyio.Event()
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError):
            pass
        finally:
            self._eof = True
            self._changed.set()

    def find(self, event: str, **fields: Any) -> list[dict[str, Any]]:
        return [
            line
            for line in self.lines
            if line.get("event") == event and all(line.get(k) == v for k, v in fields.items())
        ]

    async def wait_until(
        self, predicate: Callable[[], Any], what: str, within: float = 30.0
    ) -> Any:
        """Wait until ``predicate()`` is truthy (re-checked whenever a line arrives)."""
        try:
            with anyio.fail_after(within):
                while not (result := predicate()):
                    if self._eof:
                        raise GoError(
                            f"river go run ended while waiting for {what}:\n{self.stderr_text()}"
                        )
                    await self._changed.wait()
        except TimeoutError:
            raise TimeoutError(
                f"no {what} from river go within {within}s; lines so far:\n"
                + "\n".join(json.dumps(line) for line in self.lines[-30:])
                + f"\nstderr:\n{self.stderr_text()}"
            ) from None
        return result

    async def wait_for(
        self, event: str, within: float = 30.0, count: int = 1, **fields: Any
    ) -> dict[str, Any]:
        """The ``count``-th line (ever printed) of this event with these fields."""

        def found() -> dict[str, Any] | None:
            hits = self.find(event, **fields)
            return hits[count - 1] if len(hits) >= count else None

        return dict(await self.wait_until(found, f"{event} {fields}", within))

    async def stop(self) -> None:
        """Graceful stop: River Go's Client.Stop; waits for the process to exit."""
        assert self._proc.stdin is not None
        with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
            await self._proc.stdin.send(b"stop\n")
        await self.wait_for("stopped", within=40)
        with anyio.fail_after(10):
            rc = await self._proc.wait()
        if rc != 0:
            raise GoError(f"river go run exited with {rc}:\n{self.stderr_text()}")
