"""From accepted request to Prefect flow run: the outbox and its reconciler.

``create_request`` persists a request first (``flow_run_id`` NULL: the request is in
the outbox), answers the client, and calls :func:`notify_new_request`, which only
wakes the drainer of this process. :func:`drain_outbox` creates the flow runs with
the server's bulk route (idempotency key = request id, so nothing is ever scheduled
twice) and stores ``Request.flow_run_id``. :func:`run_reconciler` loops it: woken by
notifications, and every ``interval`` seconds anyway, so a request accepted while
Prefect was down is scheduled once Prefect is back, by whichever process runs a
reconciler (the API, ``campaign-trigger up``, every worker).

A request cancelled while still in the outbox is cancelled in the database only
(``lifecycle.cancel_request``); if the drainer created its run in the meantime, the
drainer cancels that run right away, and the flow itself refuses a cancelled request.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

from prefect import get_client
from prefect.client.orchestration import PrefectClient
from sqlalchemy import func, update
from sqlmodel import Session, col, select

from campaign_trigger.services import prefect_runs
from campaign_trigger.store.db import Sessions, in_thread
from campaign_trigger.store.models import Request, RequestState

logger = logging.getLogger(__name__)

_wake_lock = threading.Lock()
_wakers: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = []


def notify_new_request(request_id: str) -> None:
    """Wake this process's outbox drainers (non-blocking, thread-safe, never raises)."""
    with _wake_lock:
        wakers = list(_wakers)
    for loop, event in wakers:
        try:
            loop.call_soon_threadsafe(event.set)
        except RuntimeError:  # that loop is closed: its reconciler is gone
            continue
    logger.debug("outbox notified (%d drainers)", len(wakers))


def in_outbox() -> tuple[Any, ...]:
    """The requests in the outbox: accepted, still scheduled, no flow run yet."""
    return (col(Request.flow_run_id).is_(None), Request.state == RequestState.scheduled)


def outbox_depth(*, session: Session) -> int:
    """How many accepted requests wait for their flow run (the outbox's length)."""
    return int(session.exec(select(func.count()).select_from(Request).where(*in_outbox())).one())


def _outbox_batch(session: Session, limit: int) -> list[prefect_runs.RunToCreate]:
    rows = session.exec(
        select(Request).where(*in_outbox()).order_by(col(Request.send_at)).limit(limit)
    ).all()
    session.commit()  # end the read: this session lives across Prefect calls
    return [
        prefect_runs.RunToCreate(
            request_id=row.id,
            campaign_id=row.campaign_id,
            org_id=row.org_id,
            send_at=row.send_at,
        )
        for row in rows
    ]


def _record_flow_runs(session: Session, created: dict[str, str]) -> list[str]:
    """Store the run ids; returns the flow run ids of requests cancelled meanwhile."""
    for request_id, flow_run_id in created.items():
        session.execute(
            update(Request)
            .where(col(Request.id) == request_id)
            .where(col(Request.flow_run_id).is_(None))
            .values(flow_run_id=flow_run_id)
        )
    states = session.exec(
        select(Request.id, Request.state).where(col(Request.id).in_(list(created)))
    ).all()
    session.commit()
    return [created[rid] for rid, state in states if state == RequestState.canceled]


async def drain_outbox(
    *, session: Session, batch_size: int = 500, client: PrefectClient | None = None
) -> int:
    """Create the flow runs of the requests in the outbox; returns how many were created.

    Raises whatever the Prefect client raises when the server cannot be reached; the
    requests then simply stay in the outbox.
    """
    if client is None:
        async with get_client() as own_client:
            return await drain_outbox(session=session, batch_size=batch_size, client=own_client)
    total = 0
    while True:
        batch = await in_thread(_outbox_batch, session, batch_size)
        if not batch:
            return total
        created = await prefect_runs.create_runs(client, batch)
        cancelled = await in_thread(_record_flow_runs, session, created)
        for flow_run_id in cancelled:
            await prefect_runs.cancel_if_scheduled(client, flow_run_id)
        total += len(created)
        logger.info("outbox: %d flow runs created", len(created))
        if len(created) < len(batch) or len(batch) < batch_size:
            return total


GATHER_SECONDS = 0.1


async def run_reconciler(
    *, sessions: Sessions, stop: asyncio.Event | None = None, interval: float = 1.0
) -> None:
    """Drain the outbox when notified, and every ``interval`` seconds, until ``stop``
    (a session from ``sessions`` per drain).

    A notification drains at once if the last drain began :data:`GATHER_SECONDS` ago or
    more (the first request after a quiet spell, a one-time code say, waits for
    nothing), else once it has: the requests accepted meanwhile go to Prefect in the
    same bulk call. Drained one by one (a read, a call to Prefect, a write each), the
    flow runs of bench/api_create_cpu.py's creates took more of the API's CPU than its
    scheduled lists."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    wake = asyncio.Event()
    entry = (loop, wake)
    with _wake_lock:
        _wakers.append(entry)
    failures = 0
    try:
        while not stop.is_set():
            wake.clear()
            try:
                async with get_client() as client:  # one client while all goes well
                    while not stop.is_set():
                        wake.clear()
                        drained = loop.time()
                        with sessions() as session:
                            await drain_outbox(session=session, client=client)
                        failures = 0
                        await _wait(wake, stop, interval)
                        gathered = drained + GATHER_SECONDS - loop.time()
                        if wake.is_set() and not stop.is_set() and gathered > 0:
                            await _wait(asyncio.Event(), stop, gathered)
            except Exception as exc:  # Prefect down, database busy: try again later
                failures += 1
                prefect_runs.forget_deployment_id()
                if failures in (1, 10) or failures % 100 == 0:
                    logger.warning("outbox drain failed (%d times): %r", failures, exc)
            await _wait(wake, stop, min(interval * 2**failures, 10.0))
    finally:
        with _wake_lock:
            _wakers.remove(entry)


async def _wait(wake: asyncio.Event, stop: asyncio.Event, seconds: float) -> None:
    waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stop.wait())]
    _done, pending = await asyncio.wait(
        waiters, timeout=seconds, return_when=asyncio.FIRST_COMPLETED
    )
    for waiter in pending:
        waiter.cancel()
