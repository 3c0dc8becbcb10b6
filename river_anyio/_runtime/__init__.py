"""The runtime: the only part of river_anyio that spawns tasks.

Each client run is one task group (``_entry.run_client``, run by ``_supervisor.ClientRun``) with nested scopes for the
notifier, the completer, the leader subtree and the producers, one per queue, each with its own
job nursery. Every long-lived service runs as ``run(*, task_status)``.
"""

from __future__ import annotations
