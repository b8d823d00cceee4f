"""How often a request fanning out reads its shares' runs from Prefect: every
``WAIT_SECONDS`` while shares wait to be made (an ended one is replaced within that),
every ``ENDED_SECONDS`` once every share is made (only to notice one that failed), and
never right after making them."""

from __future__ import annotations

import itertools
import time
import uuid
from datetime import UTC, datetime

import pytest

from campaign_trigger.flows import fan_out
from campaign_trigger.services.delivery_run import DeliveryPlan
from campaign_trigger.store.models import Channel
from campaign_trigger.tasks import artifacts


class _Bar:
    def show(self, done: int) -> None:
        pass

    async def close(self) -> None:
        pass


def _plan(chunk_count: int) -> DeliveryPlan:
    return DeliveryPlan(
        request_id=f"r-{uuid.uuid4().hex[:6]}",
        campaign_id="c",
        channel=Channel.push,
        title="t",
        body="b",
        send_at=datetime.now(UTC),
        apps=(),
        message_count=chunk_count,
        chunk_size=1,
        chunk_count=chunk_count,
    )


async def _reads_of_runs(
    monkeypatch: pytest.MonkeyPatch, *, shares: int, live: int, seconds: float
) -> list[float]:
    """When the runs were read while a request of ``shares`` shares (one chunk each,
    ``live`` not ended at a time) ran for ``seconds``, its shares ending one a second
    apart from the start."""
    monkeypatch.setattr(fan_out, "RECORDED_SECONDS", 0.01)
    monkeypatch.setattr(fan_out, "WAIT_SECONDS", 0.05)
    monkeypatch.setattr(fan_out, "ENDED_SECONDS", 0.25)
    started = time.monotonic()
    made: list[uuid.UUID] = []
    reads: list[float] = []

    async def start_share(plan: DeliveryPlan, share: list[int]) -> uuid.UUID:
        made.append(uuid.uuid4())
        return made[-1]

    async def still_running(run_ids: list[uuid.UUID]) -> list[uuid.UUID]:
        reads.append(time.monotonic() - started)
        return run_ids  # none ends: the chunks' count says when it is over

    async def recorded_count(request_id: str) -> int:
        return shares if time.monotonic() - started >= seconds else 0

    async def recorded(request_id: str) -> set[int]:
        return set(range(shares))

    monkeypatch.setattr(fan_out, "_start_share", start_share)
    monkeypatch.setattr(fan_out, "_still_running", still_running)
    monkeypatch.setattr(fan_out, "recorded_chunk_count", recorded_count)
    monkeypatch.setattr(fan_out, "recorded_chunks", recorded)
    monkeypatch.setattr(artifacts, "Progress", lambda **kwargs: _Bar())
    missing = await fan_out.fan_out(_plan(shares), per_run=1, live=live)
    assert missing == set()
    assert len(made) == min(shares, live)  # no run ended: no share replaced
    return reads


async def test_with_every_share_made_the_runs_are_read_every_ended_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = await _reads_of_runs(monkeypatch, shares=3, live=3, seconds=0.9)
    assert 2 <= len(reads) <= 4, reads  # every 0.25 s over 0.9 s, not every 0.05 s
    assert reads[0] >= 0.2, reads  # not right after the shares were made
    assert all(b - a >= 0.2 for a, b in itertools.pairwise(reads)), reads


async def test_with_shares_waiting_to_be_made_the_runs_are_read_every_wait_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads = await _reads_of_runs(monkeypatch, shares=3, live=1, seconds=0.5)
    assert len(reads) >= 5, reads  # every 0.05 s (or as often as the machine manages)
    assert reads[0] >= 0.04, reads
