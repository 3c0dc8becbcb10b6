"""What the job and queue APIs (``client.jobs``, ``client.queues``) share: reaching the
database on the client's own connections or inside a caller's transaction, and the page-size
limit River puts on its list and delete-many calls."""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from ._errors import ValidationError

if TYPE_CHECKING:
    from ._client import Client
    from .drivers import Executor

#: The largest ``limit`` a list or delete-many call takes.
LIST_MAX: Final = 10_000


def validate_limit(value: object) -> int:
    """``limit`` as an int from 1 to :data:`LIST_MAX`; :class:`ValidationError` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= LIST_MAX:
        raise ValidationError("limit", f"must be an int between 1 and {LIST_MAX:,}", value)
    return value


class ClientAPI:
    """Base of the APIs hung on a client: their calls run on the client's driver, or, given a
    transaction (the ``*_tx`` variants), inside it."""

    def __init__(self, client: Client) -> None:
        self._client = client

    def _ex(self, tx: object | None) -> Executor:
        driver = self._client.driver
        return driver.executor() if tx is None else driver.executor_for(tx)
