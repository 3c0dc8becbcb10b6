"""Run the River UI binary against a database and call its HTTP API.

:func:`serve` starts ``riverui`` on a free loopback port with ``DATABASE_URL`` set, collects
its log in a file, waits until its health check (which queries the database) answers,
and stops it when the block ends. :class:`RiverUI` calls the JSON API River UI's own front end
uses (``/api/...``: routes and shapes from River UI's ``handler_api_endpoint.go``).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import tempfile
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

__all__ = ["RiverUI", "RiverUIError", "serve"]


class RiverUIError(Exception):
    """River UI did not start, or answered a request with an error status."""


#: Straight to loopback, whatever proxy the environment names.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RiverUI:
    """A running River UI: its base URL, its log so far, and its API."""

    def __init__(self, base_url: str, log_path: Path) -> None:
        self.base_url = base_url
        self.log_path = log_path

    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with _DIRECT.open(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """The decoded JSON answer; :class:`RiverUIError` for a status other than 200."""
        status, answer = await anyio.to_thread.run_sync(self._request, method, path, body)
        if status != 200:
            raise RiverUIError(f"{method} {path}: HTTP {status}: {answer}\nlog:\n" + self.logs())
        return answer

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def post(self, path: str, body: Any) -> Any:
        return await self.request("POST", path, body)

    async def put(self, path: str) -> Any:
        return await self.request("PUT", path)

    def logs(self) -> str:
        """The last lines River UI logged (stdout and stderr)."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(lines[-40:])

    async def _healthy(self, proc: anyio.abc.Process) -> None:
        """Wait until the server accepts connections and its database check passes."""
        delay = 0.02
        while True:
            if proc.returncode is not None:
                raise RiverUIError(
                    f"riverui exited with {proc.returncode} before it was healthy:\n" + self.logs()
                )
            with contextlib.suppress(OSError):
                status, _ = await anyio.to_thread.run_sync(
                    self._request, "GET", "/api/health-checks/complete"
                )
                if status == 200:
                    return
            # No readiness signal exists beyond the log line that precedes listening, so the
            # probe is retried with a short backoff (bounded by the caller's deadline).
            await anyio.sleep(delay)
            delay = min(delay * 2, 0.5)


@contextlib.asynccontextmanager
async def serve(
    binary: Path, database_url: str, *, env: dict[str, str] | None = None
) -> AsyncIterator[RiverUI]:
    """River UI serving ``database_url`` on a free loopback port until the block ends."""
    port = _free_port()
    proc_env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "RIVER_HOST": "127.0.0.1",
        "PORT": str(port),
        **(env or {}),
    }
    with tempfile.TemporaryDirectory(prefix="riverui-") as tmp:
        ui = RiverUI(f"http://127.0.0.1:{port}", Path(tmp) / "riverui.log")
        with ui.log_path.open("wb") as log:
            proc = await anyio.open_process(
                [str(binary)], env=proc_env, stdin=None, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            with anyio.fail_after(30):
                await ui._healthy(proc)
            yield ui
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                if proc.returncode is None:
                    proc.terminate()
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
            await proc.aclose()
