"""The queue APIs: ``client.queues`` (River's QueueGet, QueueList, QueuePause, QueueResume and
QueueUpdate, on the ``river_queue`` table every client shares) and ``client.local_queues``
(adding and removing the queues this running client works).

Pause, resume and metadata changes are written together with River's ``river_control``
notification, so they reach every client's producers (any language) when they commit; a
client that polls instead of listening sees them within its settings poll, and the one
making the call applies them to its own producers at once.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol

from ._api_common import ClientAPI, validate_limit
from ._config import QueueConfig
from ._errors import NotFoundError, ValidationError
from ._job import validate_queue_name
from .drivers import TOPIC_CONTROL, QueueRow

if TYPE_CHECKING:
    from ._client import Client

__all__ = ["LocalQueueHost", "LocalQueues", "QueuesAPI"]


def _name(value: object, *, wildcard: bool = False) -> str:
    if wildcard and value == "*":
        return "*"
    if not isinstance(value, str) or not value:
        raise ValidationError("name", "must be a non-empty queue name", value)
    return value


class QueuesAPI(ClientAPI):
    """``client.queues``: River's queue API; every call has a ``*_tx`` twin that runs in the
    caller's transaction (its notification is delivered at commit)."""

    async def get(self, name: str) -> QueueRow:
        """The queue's row; :class:`NotFoundError` when there is none (rows of queues nobody
        works expire after River's retention)."""
        return await self._get(None, name)

    async def get_tx(self, tx: object, name: str) -> QueueRow:
        return await self._get(tx, name)

    async def _get(self, tx: object | None, name: str) -> QueueRow:
        row = await self._ex(tx).queue_get(_name(name))
        if row is None:
            raise NotFoundError(f"queue {name!r} not found")
        return row

    async def list(self, *, limit: int = 100) -> list[QueueRow]:
        """Queues ordered by name, at most ``limit`` (1 to 10,000)."""
        return await self._ex(None).queue_list(limit=validate_limit(limit))

    async def list_tx(self, tx: object, *, limit: int = 100) -> builtins.list[QueueRow]:
        return await self._ex(tx).queue_list(limit=validate_limit(limit))

    async def pause(self, name: str) -> None:
        """Pause a queue (``"*"``: every queue with a row) on every client: producers stop
        claiming, running jobs carry on. Pausing a paused queue changes nothing.
        :class:`NotFoundError` for an unknown name."""
        await self._set_paused(None, name, "pause")

    async def pause_tx(self, tx: object, name: str) -> None:
        await self._set_paused(tx, name, "pause")

    async def resume(self, name: str) -> None:
        """Resume a paused queue (``"*"``: every queue) on every client."""
        await self._set_paused(None, name, "resume")

    async def resume_tx(self, tx: object, name: str) -> None:
        await self._set_paused(tx, name, "resume")

    async def _set_paused(self, tx: object | None, name: str, action: str) -> None:
        name = _name(name, wildcard=True)
        ex = self._ex(tx)
        matched = await (ex.queue_pause(name) if action == "pause" else ex.queue_resume(name))
        if not matched and name != "*":
            raise NotFoundError(f"queue {name!r} not found")
        if tx is None:
            self._client._control_local(name, {"action": action, "queue": name})

    async def update(self, name: str, *, metadata: Mapping[str, Any] | None = None) -> QueueRow:
        """River's QueueUpdate: replace the queue's metadata (a JSON object) when given, and
        tell every client (``metadata_changed``). :class:`NotFoundError` for an unknown name."""
        async with self._client.transaction() as tx:  # the row and its notification
            return await self._update(tx, name, metadata)

    async def update_tx(
        self, tx: object, name: str, *, metadata: Mapping[str, Any] | None = None
    ) -> QueueRow:
        return await self._update(tx, name, metadata)

    async def _update(self, tx: object, name: str, metadata: object) -> QueueRow:
        name = _name(name)
        encoded: bytes | None = None
        if metadata is not None:
            if not isinstance(metadata, Mapping):
                raise ValidationError("metadata", "must be a mapping (a JSON object)", metadata)
            try:
                encoded = json.dumps(metadata, separators=(",", ":"), allow_nan=False).encode()
            except (TypeError, ValueError) as exc:
                raise ValidationError("metadata", f"must be JSON-encodable: {exc}") from None
        ex = self._ex(tx)
        row = await ex.queue_update(name, metadata=encoded)
        if row is None:
            raise NotFoundError(f"queue {name!r} not found")
        if encoded is not None:
            payload = (
                '{"action":"metadata_changed","metadata":'
                + encoded.decode()
                + ',"queue":'
                + json.dumps(row.name)
                + "}"
            )
            await ex.notify_many(TOPIC_CONTROL, [payload])
        return row


class LocalQueueHost(Protocol):
    """What a running client offers ``client.local_queues`` (the runtime implements it)."""

    async def _add_queue(self, name: str, config: QueueConfig) -> None: ...

    async def _remove_queue(self, name: str) -> None: ...


class LocalQueues:
    """``client.local_queues``: the queues this client works, changed while it runs."""

    def __init__(self, client: Client) -> None:
        self._client = client
        self._host: LocalQueueHost | None = None

    def _running(self) -> LocalQueueHost:
        if self._host is None:
            raise ValidationError(
                "local_queues",
                "queues can only be added or removed on a running client that works jobs "
                "(open_client with workers)",
            )
        return self._host

    async def add(self, name: str, config: QueueConfig) -> None:
        """Start working queue ``name`` now, with ``config``. A name already worked is a
        :class:`ValidationError`."""
        validate_queue_name(name, "name")
        if not isinstance(config, QueueConfig):
            raise ValidationError("config", "must be a QueueConfig", config)
        await self._running()._add_queue(name, config)

    async def remove(self, name: str) -> None:
        """Stop working queue ``name``: its producer stops claiming, and this returns once its
        running jobs have finished and been recorded. :class:`NotFoundError` if it is not
        worked here. If the wait is cancelled the queue keeps stopping; call again to wait."""
        if not isinstance(name, str):
            raise ValidationError("name", "must be a str", name)
        await self._running()._remove_queue(name)
