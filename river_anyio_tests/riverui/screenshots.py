"""Take the River UI screenshots in ``docs/_static/riverui/`` from a real run.

    python -m river_anyio_tests.riverui.screenshots [--server-url URL] [--out DIR]

Creates a database on the PostgreSQL server (``--server-url``, else
``RIVER_ANYIO_TEST_DATABASE_URL``; its user must be allowed to create databases), migrates it
with ``river-anyio migrate-up``, has a river_anyio client work the tests' mix of jobs
(``_scenario.py``) and keeps it running, serves River UI (built as the tests build it) on it,
and has headless Chromium (Debian's ``chromium`` package, driven over its DevTools pipe) save
three PNGs, 1280 wide, each once the page shows its data: the jobs list, a failed job's detail
with its error, and the queues page. The database is dropped at the end.
CI does not run this (no Chromium there); the API checks in ``test_riverui.py`` run there.
"""

from __future__ import annotations

import argparse
import base64
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

import anyio

from ._build import build, go_binary
from ._scenario import Workers, open_mix_client, work_the_mix
from ._server import serve

DOCS_DIR = Path(__file__).resolve().parents[2] / "docs" / "_static" / "riverui"
DB_NAME = "river_anyio_riverui_screenshots"
WIDTH, HEIGHT, DETAIL_HEIGHT = 1280, 800, 1100

#: As root on a machine with no outside network: no sandbox, no GPU, nothing phoning home.
CHROMIUM_FLAGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}",
)  # fmt: skip


class Chromium:
    """Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
    JSON messages ending in NUL, read on its fd 3 and written on its fd 4), so a page can be
    waited on until it shows its data and a collapsed section opened before the picture."""

    def __init__(self, chromium: str, profile: str) -> None:
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()
        self._proc = subprocess.Popen(
            ["bash", "-c", f'exec "$0" "$@" 3<&{to_r} 4>&{from_w} {to_r}<&- {from_w}>&-',
             chromium, *CHROMIUM_FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile}",
             "about:blank"],
            pass_fds=(to_r, from_w), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._last_id = 0

    def close(self) -> None:
        os.close(self._to_w)  # Chromium exits when its end of the pipe closes
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._from_r)

    def _receive(self) -> dict[str, Any]:
        while b"\0" not in self._buf:
            chunk = os.read(self._from_r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buf += chunk
        raw, self._buf = self._buf.split(b"\0", 1)
        return dict(json.loads(raw))

    def send(self, method: str, params: dict[str, Any] | None = None, session: str = "") -> Any:
        self._last_id += 1
        message: dict[str, Any] = {"id": self._last_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_w, json.dumps(message).encode() + b"\0")
        while True:  # events and other sessions' messages are not needed here
            answer = self._receive()
            if answer.get("id") == self._last_id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer["result"]

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression[:60]}...: {result['exceptionDetails']}")
        return result["result"].get("value")

    def screenshot(self, url: str, out: Path, *, shows: str, height: int, expand: bool) -> None:
        """Open ``url``, wait until its text includes ``shows``, open every ``<details>`` if
        ``expand``, and save a ``WIDTH`` × ``height`` PNG."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": WIDTH, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session,
        )
        self.send("Page.navigate", {"url": url}, session)
        self.evaluate(session, _WAIT_FOR_TEXT.replace("TEXT", json.dumps(shows)))
        if expand:
            self.evaluate(
                session, "document.querySelectorAll('details').forEach(d => d.open = true)"
            )
        self.evaluate(session, _TWO_FRAMES)  # let the change paint
        png = self.send("Page.captureScreenshot", {"format": "png"}, session)["data"]
        out.write_bytes(base64.b64decode(png))
        self.send("Target.closeTarget", {"targetId": target})
        print(f"{out} ({out.stat().st_size // 1024} KiB) <- {url}")


_WAIT_FOR_TEXT = """new Promise((ok, fail) => {
  const started = Date.now();
  (function check() {
    if (document.body && document.body.innerText.includes(TEXT)) ok(true);
    else if (Date.now() - started > 20000) fail(new Error("page never showed " + TEXT));
    else setTimeout(check, 50);
  })();
})"""
_TWO_FRAMES = "new Promise(ok => requestAnimationFrame(() => requestAnimationFrame(() => ok(1))))"


def _db_url(server_url: str, name: str) -> str:
    return urllib.parse.urlunsplit(urllib.parse.urlsplit(server_url)._replace(path="/" + name))


def _recreate(server_url: str, *, drop_only: bool = False) -> None:
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DB_NAME}" WITH (FORCE)')
        if not drop_only:
            conn.execute(f'CREATE DATABASE "{DB_NAME}"')


async def take(server_url: str, out_dir: Path, chromium: str, binary: Path) -> None:
    url = _db_url(server_url, DB_NAME)
    await anyio.run_process(
        [sys.executable, "-m", "river_anyio", "migrate-up", "--database-url", url], check=True
    )
    workers = Workers()
    async with open_mix_client(url, workers) as run, serve(binary, url) as ui:
        mix = await work_the_mix(run, workers, emails=12)
        await anyio.Path(out_dir).mkdir(parents=True, exist_ok=True)
        # (page, text it shows once its data has loaded, height, open collapsed sections):
        # the job's page is taller, down to the end of its errors.
        pages = {
            "jobs-completed.png": ("/jobs?state=completed", "user0@example.com", HEIGHT, False),
            "job-errors.png": (f"/jobs/{mix.discarded}", "card declined for globex",
                               DETAIL_HEIGHT, True),
            "queues.png": ("/queues", "Paused", HEIGHT, False),
        }  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="riverui-chromium-") as profile:
            browser = Chromium(chromium, profile)
            try:
                for name, (path, shows, height, expand) in pages.items():
                    shot = functools.partial(
                        browser.screenshot, ui.base_url + path, out_dir / name, shows=shows,
                        height=height, expand=expand,
                    )  # fmt: skip
                    await anyio.to_thread.run_sync(shot)
            finally:
                browser.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server-url", default=os.environ.get("RIVER_ANYIO_TEST_DATABASE_URL"))
    parser.add_argument("--out", type=Path, default=DOCS_DIR)
    args = parser.parse_args()
    if not args.server_url:
        parser.error("give --server-url or set RIVER_ANYIO_TEST_DATABASE_URL")
    chromium = shutil.which("chromium")
    go = go_binary()
    if chromium is None or go is None:
        parser.error("needs `chromium` (apt-get install chromium) and `go` on PATH")
    binary, _ = build(go)
    _recreate(args.server_url)
    try:
        anyio.run(take, args.server_url, args.out, chromium, binary)
    except subprocess.CalledProcessError as exc:
        print(f"failed: {exc}", file=sys.stderr)
        return 1
    finally:
        _recreate(args.server_url, drop_only=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
