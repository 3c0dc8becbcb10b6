"""The conformance adapter speaks the harness's contract on its own (River's harness judges the
rest, with River Go beside it: ``nox -s conformance``): one response per request line, in
order; unknown methods and params refused with their codes; a job inserted, worked and listed;
a clean exit when stdin closes. On SQLite, under both loops."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import river_anyio

ROOT = Path(__file__).resolve().parents[2]


class Adapter:
    """The adapter as a process, one request at a time, as the harness drives it."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.proc = proc
        self.next_id = 0

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.next_id += 1
        request = {"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        response: dict[str, Any] = json.loads(self.proc.stdout.readline())
        assert response["id"] == self.next_id
        return response


@pytest.fixture(params=["asyncio", "trio"])
def adapter(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Adapter]:
    env = {
        **os.environ,
        "RIVER_CONFORMANCE_DRIVER": "sqlite",
        "RIVER_CONFORMANCE_DATABASE_URL": str(tmp_path / "river.sqlite3"),
        "RIVER_ANYIO_CONFORMANCE_BACKEND": request.param,
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "river_anyio_tests.conformance"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=ROOT, env=env,
    )  # fmt: skip
    try:
        yield Adapter(proc)
        assert proc.stdin is not None
        proc.stdin.close()  # the harness's way of saying goodbye: the adapter exits 0
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def test_the_adapter_answers_the_contract(adapter: Adapter) -> None:
    assert adapter.call("handshake", {})["result"] == {
        "driver": "sqlite",
        "implementation": "river_anyio",
        "version": river_anyio.__version__,
    }
    assert adapter.call("migrate", {})["result"]["versions"][0] == 1
    assert adapter.call("nonsense", {})["error"]["code"] == -32601
    refused = adapter.call("insert", {"jobs": [], "bogus": 1})["error"]
    assert refused["code"] == -32602 and "bogus" in refused["message"]
    assert adapter.call("tx_end", {"tx": "never-begun"})["error"]["code"] == -32001
    assert adapter.call("stats", {})["error"]["code"] == -32002  # no client running

    args = {"behavior": "output", "duration_ms": 0, "message": "hello"}
    inserted = adapter.call("insert", {"jobs": [args]})["result"]["results"][0]["job"]
    assert inserted["args"] == args and inserted["state"] == "available"
    assert adapter.call("start", {"client_id": "adapter-test"})["result"] == {}
    deadline = time.monotonic() + 20
    while True:  # the harness polls rows the same way
        (row,) = adapter.call("list", {"ids": [inserted["id"]]})["result"]["jobs"]
        if row["state"] == "completed" or time.monotonic() > deadline:
            break
        time.sleep(0.02)
    assert row["state"] == "completed" and row["attempted_by"] == ["adapter-test"]
    assert row["metadata"]["output"] == {"message": "hello"}
    assert "job_completed" in adapter.call("stats", {})["result"]["events"]
    assert adapter.call("stop", {})["result"] == {}
