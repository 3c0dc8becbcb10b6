"""Build the River Go interop program (``go/``) into a cache keyed by its sources.

Standard library only, so ``python -m river_anyio_tests.interop._go_build`` can build the
program before the test environment exists (CI does, so the first compile is not charged to
a test's timeout).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

GO_DIR = Path(__file__).parent / "go"
REQUIRE_ENV = "RIVER_ANYIO_REQUIRE_GO"
#: The River Go release the program is pinned to (checked against go.mod by a test).
RIVER_VERSION = "v0.51.2"


class GoError(Exception):
    """A River Go subcommand failed."""


def go_binary() -> str | None:
    return shutil.which("go")


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "river_anyio_tests"


def source_key(go: str) -> str:
    h = hashlib.sha256()
    files = [GO_DIR / "go.mod", GO_DIR / "go.sum", *sorted(GO_DIR.glob("*.go"))]
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True)
    h.update(version.stdout.encode())
    return h.hexdigest()[:20]


def build(go: str) -> tuple[Path, float]:
    """The built program (building it if this source has not been built); and the seconds
    the build took (0 when cached)."""
    target = cache_dir() / f"riverinterop-{source_key(go)}"
    if target.exists():
        return target, 0.0
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
    started = time.monotonic()
    env = {**os.environ, "GOFLAGS": "-mod=readonly", "CGO_ENABLED": "0"}
    proc = subprocess.run(
        [go, "build", "-o", str(tmp), "."], cwd=GO_DIR, env=env, capture_output=True, text=True
    )
    if proc.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise GoError(f"building the River Go interop program failed:\n{proc.stderr}")
    os.replace(tmp, target)  # atomic: a concurrent session sees the whole file or none
    return target, time.monotonic() - started


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
