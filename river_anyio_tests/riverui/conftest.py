"""The ``riverui_binary`` fixture: River UI built from the Go module proxy, once per version.

Without ``go`` on PATH the tests that need it skip with one loud line; with
``RIVER_ANYIO_REQUIRE_GO=1`` (set by CI whenever Go is installed) that is an error instead.
The build runs after collection, outside any test's timeout, and only when a collected test
uses the fixture (CI builds it even earlier: ``python -m river_anyio_tests.riverui._build``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ._build import MODULE, REQUIRE_ENV, VERSION, BuildError, build, go_binary

_state: dict[str, Any] = {}


def _skip_reason() -> str:
    return f"River UI tests SKIPPED: no `go` on PATH to build {MODULE}@{VERSION} (install Go 1.26+)"


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any("riverui_binary" in getattr(i, "fixturenames", ()) for i in session.items):
        return
    go = go_binary()
    if go is None:
        return
    try:
        _state["binary"], _state["seconds"] = build(go)
    except BuildError as exc:
        _state["error"] = str(exc)


@pytest.fixture(scope="session")
def riverui_binary() -> Path:
    if "error" in _state:
        pytest.fail(_state["error"])
    if "binary" not in _state:
        go = go_binary()
        if go is None:
            if os.environ.get(REQUIRE_ENV) == "1":
                pytest.fail(f"{REQUIRE_ENV}=1 but {_skip_reason()}")
            _state["skipped"] = True
            pytest.skip(_skip_reason())
        _state["binary"], _state["seconds"] = build(go)
    return Path(_state["binary"])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _state.get("skipped"):
        terminalreporter.write_line("!" * 20 + " " + _skip_reason() + " " + "!" * 20, red=True)
    elif _state.get("seconds"):
        terminalreporter.write_line(
            f"River UI {VERSION} built in {_state['seconds']:.1f}s: {_state['binary']}"
        )
