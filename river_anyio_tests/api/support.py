"""What the client API tests share: a client that inserts and manages jobs without working
them, and an exception that rolls a caller's transaction back."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import river_anyio as river
from river_anyio.drivers import open_driver


class Undo(Exception):
    """Raised inside ``client.transaction()`` to roll it back."""


@asynccontextmanager
async def client_on(url: str, *, id: str = "api-client") -> AsyncIterator[river.Client]:
    """A client built on a driver of its own, as for inserting and managing jobs without
    working them (beside a running client, it is "another client")."""
    async with open_driver(url) as driver:
        yield river.Client(driver, id=id, max_attempts=25)
