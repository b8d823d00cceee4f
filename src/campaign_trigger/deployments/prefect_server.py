"""The embedded stack's Prefect server: ``prefect server start``, every SQLite
transaction begun ``IMMEDIATE``.

Prefect begins its SQLite transactions ``DEFERRED``: a transaction that read, then
writes after another connection committed, fails at once with "database is locked"
(in WAL mode SQLite cannot wait for a snapshot that is already stale), so concurrent
flow-run creation, state changes and heartbeats turn into 503s and lost creations.
``BEGIN IMMEDIATE`` takes the write lock first and waits for it (``busy_timeout``, 60 s
in Prefect's set-up): the writers queue instead of failing. A PostgreSQL server is
untouched.

Prefect's services that the product does not use are off unless the environment turns
them on: the event persister (``PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED``), which
stores every event (~15 per one-message request, each with its related resources) for
the UI's Events page, cost the server ~30 ms of CPU per request (docs/benchmarks.md).
Automations (the *Worker lost* one), task runs, logs and artifacts do not read stored
events: they work as before.

The task-run recorder (task runs reach the server as events, three per task run: Pending,
Running, Completed) writes what arrived in one transaction a second
(``RECORDER_FLUSH_SECONDS``, or at ``RECORDER_BATCH`` events) instead of one transaction
per event, Prefect's default: ~30 ms of the server's CPU per one-message request and
fewer waits for SQLite's write lock (docs/benchmarks.md). A task run's states reach the UI
up to a second later. The environment's
``PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE`` and ``..._FLUSH_INTERVAL`` win.

Once its application is built, what the server loaded is frozen for the garbage collector
(:func:`heap.settle`): its full passes walked ~580,000 objects each, 0.4 s with the
server's event loop stopped, every few tens of seconds under load (docs/benchmarks.md).

Run as ``python -m campaign_trigger.deployments.prefect_server
[start options]``; the options are ``prefect server start``'s.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from campaign_trigger import heap

if TYPE_CHECKING:
    from fastapi import FastAPI
    from prefect.server.database.configurations import AioSqliteConfiguration

# Services off in the embedded server, unless the environment names them (Prefect's
# settings: the names are read in main(), where Prefect is imported).
UNUSED_SERVICES = ("PREFECT_SERVER_SERVICES_EVENT_PERSISTER_ENABLED",)
RECORDER_BATCH = 500
RECORDER_FLUSH_SECONDS = 1  # whole seconds: Prefect rounds it down, and 0 would spin


def _begin_immediate(self: AioSqliteConfiguration, conn: Any) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _settled(create_app: Callable[..., FastAPI]) -> Callable[..., FastAPI]:
    """``create_app``, then the heap as it is frozen (:func:`heap.settle`)."""

    def create(*args: Any, **kwargs: Any) -> FastAPI:
        app = create_app(*args, **kwargs)
        heap.settle()
        return app

    return create


def main() -> None:
    heap.starting()  # before Prefect's server is imported: ~0.6 s of CPU fewer
    import prefect.settings
    from prefect.cli import app
    from prefect.server.api import server as prefect_api
    from prefect.server.database.configurations import AioSqliteConfiguration

    AioSqliteConfiguration.begin_sqlite_stmt = _begin_immediate  # type: ignore[method-assign]
    prefect_api.create_app = _settled(prefect_api.create_app)
    sys.argv = ["prefect", "server", "start", *sys.argv[1:]]
    updates: dict[Any, Any] = {
        **{getattr(prefect.settings, name): False for name in UNUSED_SERVICES},
        prefect.settings.PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_BATCH_SIZE: RECORDER_BATCH,
        prefect.settings.PREFECT_SERVER_SERVICES_TASK_RUN_RECORDER_FLUSH_INTERVAL: (
            RECORDER_FLUSH_SECONDS
        ),
    }
    with prefect.settings.temporary_settings(
        updates={k: v for k, v in updates.items() if k.name not in os.environ}
    ):
        app()


if __name__ == "__main__":
    main()
