"""Build River UI (``riverqueue.com/riverui/cmd/riverui``, pinned below) from the Go module
proxy into a cache keyed by its version and the Go toolchain's.

Standard library only, so ``python -m river_anyio_tests.riverui._build`` can build it before
the test environment exists (CI does, so module downloads and the cold compile are not charged
to a test's timeout). The build is ``go install MODULE@VERSION``, the command the how-to gives
users: River UI's own ``go.mod`` and ``go.sum`` pin its dependencies.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from river_anyio_tests.interop._go_build import REQUIRE_ENV, cache_dir, go_binary

__all__ = ["MODULE", "REQUIRE_ENV", "VERSION", "BuildError", "build", "go_binary"]

MODULE = "riverqueue.com/riverui/cmd/riverui"
#: The River UI release the tests and the how-to are pinned to.
VERSION = "v0.22.0"


class BuildError(Exception):
    """``go install`` of River UI failed."""


def target(go: str) -> Path:
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True).stdout
    key = hashlib.sha256(f"{MODULE}@{VERSION}\0{version}".encode()).hexdigest()[:16]
    return cache_dir() / f"riverui-{VERSION}-{key}"


def build(go: str) -> tuple[Path, float]:
    """The built ``riverui`` binary (building it if this version has not been built with this
    Go), and the seconds the build took (0 when cached)."""
    path = target(go)
    if path.exists():
        return path, 0.0
    path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="riverui-build-", dir=path.parent) as tmp:
        # Outside any module or workspace, with the machine's GOFLAGS dropped: `go install
        # pkg@version` builds with the module's own go.mod and go.sum.
        env = {**os.environ, "GOBIN": tmp, "CGO_ENABLED": "0", "GOFLAGS": "", "GOWORK": "off"}
        proc = subprocess.run(
            [go, "install", f"{MODULE}@{VERSION}"], cwd=tmp, env=env, capture_output=True,
            text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            raise BuildError(f"go install {MODULE}@{VERSION} failed:\n{proc.stderr}")
        os.replace(Path(tmp) / "riverui", path)  # atomic: another run sees all of it or none
    return path, time.monotonic() - started


def main() -> int:
    go = go_binary()
    if go is None:
        print("no go on PATH: nothing to build", file=sys.stderr)
        return 0
    path, seconds = build(go)
    print(f"{path} (built in {seconds:.1f}s)" if seconds else f"{path} (cached)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
