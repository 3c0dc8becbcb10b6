"""``python -m river_anyio_tests.conformance``: the conformance adapter (see the package)."""

from __future__ import annotations

from ._server import main

if __name__ == "__main__":
    main()
