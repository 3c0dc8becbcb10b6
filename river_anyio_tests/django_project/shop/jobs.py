"""The shop's job: ship an order (the worker marks it shipped)."""

from __future__ import annotations

from typing import ClassVar

import anyio
import attrs
from django.db import close_old_connections

import river_anyio as river

workers = river.Workers()


@attrs.frozen
class ShipOrder:
    kind: ClassVar[str] = "ship_order"
    order_id: int


def _mark_shipped(order_id: int) -> None:
    from shop.models import Order

    close_old_connections()
    try:
        Order.objects.filter(id=order_id).update(state="shipped")
    finally:
        close_old_connections()


@workers.register(ShipOrder)
async def ship_order(ctx: river.WorkContext, job: river.Job[ShipOrder]) -> None:
    # Django's ORM is blocking: run it in a worker thread (on asyncio and trio alike)
    await anyio.to_thread.run_sync(_mark_shipped, job.args.order_id)


def apsw_config() -> river.Config:
    """A Config choosing apsw for River's SQLite file, which Django's ORM also opens (the
    worker refuses it: two SQLite libraries on one file in one process)."""
    return river.Config(workers=workers, driver_options={"sqlite_module": None})
