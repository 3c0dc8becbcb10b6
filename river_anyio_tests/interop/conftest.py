"""The ``river_go`` fixture: River Go's interop program, built once per source version.

Without ``go`` on PATH the tests that need it skip with one loud line; with
``RIVER_ANYIO_REQUIRE_GO=1`` (set by CI whenever Go is installed) that is an error instead.
The build runs after collection, outside any test's timeout, and only when a collected test
uses the fixture.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from ._river_go import REQUIRE_ENV, GoError, RiverGo, build, go_binary

_state: dict[str, Any] = {}


def _skip_reason() -> str:
    return "River Go interop tests SKIPPED: no `go` on PATH (install Go 1.26+ to run them)"


def pytest_collection_finish(session: pytest.Session) -> None:
    if not any("river_go" in getattr(item, "fixturenames", ()) for item in session.items):
        return
    go = go_binary()
    if go is None:
        return
    try:
        _state["binary"], _state["seconds"] = build(go)
    except GoError as exc:
        _state["error"] = str(exc)


@pytest.fixture(scope="session")
def river_go() -> RiverGo:
    if "error" in _state:
        pytest.fail(_state["error"])
    if "binary" not in _state:
        if go_binary() is None:
            if os.environ.get(REQUIRE_ENV) == "1":
                pytest.fail(f"{REQUIRE_ENV}=1 but {_skip_reason()}")
            _state["skipped"] = True
            pytest.skip(_skip_reason())
        _state["binary"], _state["seconds"] = build(go_binary())  # type: ignore[arg-type]
    return RiverGo(_state["binary"])


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _state.get("skipped"):
        terminalreporter.write_line("!" * 20 + " " + _skip_reason() + " " + "!" * 20, red=True)
    elif _state.get("seconds"):
        terminalreporter.write_line(
            f"River Go interop program built in {_state['seconds']:.1f}s: {_state['binary']}"
        )
