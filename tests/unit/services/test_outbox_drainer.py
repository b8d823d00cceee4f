"""When the outbox drainer creates flow runs: at once for a request after a quiet spell,
the requests of a burst together once ``GATHER_SECONDS`` has passed since the last drain."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from campaign_trigger.services import scheduling


@pytest.fixture
def drains(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """When each drain began (no Prefect, no database: the loop's timing only)."""
    began: list[float] = []

    async def drain_outbox(**_: Any) -> int:
        began.append(time.monotonic())
        return 0

    @contextlib.asynccontextmanager
    async def get_client() -> AsyncIterator[None]:
        yield None

    monkeypatch.setattr(scheduling, "drain_outbox", drain_outbox)
    monkeypatch.setattr(scheduling, "get_client", get_client)
    return began


@contextlib.contextmanager
def _no_session() -> Iterator[None]:
    yield None


async def test_a_request_after_a_quiet_spell_is_drained_at_once_a_burst_together(
    drains: list[float], monkeypatch: pytest.MonkeyPatch
) -> None:
    gather = 0.5  # wide enough for a loaded machine to tell "at once" from "after the gap"
    monkeypatch.setattr(scheduling, "GATHER_SECONDS", gather)
    stop = asyncio.Event()
    drainer = asyncio.create_task(
        scheduling.run_reconciler(sessions=_no_session, stop=stop, interval=60)  # type: ignore[arg-type]
    )
    await asyncio.sleep(gather + 0.1)
    assert len(drains) == 1  # the first drain, at start

    notified = time.monotonic()
    scheduling.notify_new_request("r-1")
    await asyncio.sleep(0.2)
    assert len(drains) == 2
    assert drains[1] - notified < 0.2  # at once

    for n in range(5):  # a burst right after that drain: gathered
        scheduling.notify_new_request(f"r-{n + 2}")
        await asyncio.sleep(0.02)
    await asyncio.sleep(gather)
    assert len(drains) == 3
    assert drains[2] - drains[1] >= gather * 0.99

    stop.set()
    await drainer
