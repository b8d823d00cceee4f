"""A request fanning out: it delivers its first share itself, at once, while it makes the
others' runs; and how often it reads its shares' runs from Prefect: every
``WAIT_SECONDS`` while shares wait to be made (an ended one is replaced within that),
every ``ENDED_SECONDS`` once every share is made (only to notice one that failed), and
never right after making them."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid

import pytest

from campaign_trigger.flows import fan_out
from campaign_trigger.services.delivery_run import DeliveryPlan
from campaign_trigger.tasks import artifacts
from delivery_support import plan_of


class _Bar:
    def show(self, done: int) -> None:
        pass

    async def close(self) -> None:
        pass


class _Request:
    """What a fanning-out request did: the share runs it made and when it read them, and
    what it delivered itself (and when, against the first share run made)."""

    def __init__(self) -> None:
        self.made: list[list[int]] = []
        self.reads: list[float] = []
        self.here: list[list[int]] = []
        self.here_before_made: list[int] = []


async def _fan_out(
    monkeypatch: pytest.MonkeyPatch,
    *,
    shares: int,
    live: int,
    seconds: float,
    already: frozenset[int] = frozenset(),
    here_fails: bool = False,
) -> _Request:
    """A request of ``shares`` shares (one chunk each, ``live`` runs not ended at a time)
    running for ``seconds``, ``already`` recorded: until then no share run ends. If
    ``here_fails``, its own share's chunk fails and is never recorded."""
    monkeypatch.setattr(fan_out, "RECORDED_SECONDS", 0.01)
    monkeypatch.setattr(fan_out, "WAIT_SECONDS", 0.05)
    monkeypatch.setattr(fan_out, "ENDED_SECONDS", 0.25)
    started = time.monotonic()
    request = _Request()

    async def start_share(plan: DeliveryPlan, share: list[int]) -> uuid.UUID:
        await asyncio.sleep(0.01)  # a call to the Prefect server
        request.made.append(share)
        return uuid.uuid4()

    ended = set(range(1, shares)) if here_fails else set(range(shares))

    async def still_running(run_ids: list[uuid.UUID]) -> list[uuid.UUID]:
        request.reads.append(time.monotonic() - started)
        if here_fails and time.monotonic() - started >= seconds:
            return []
        return run_ids  # none ends: the chunks' count says when it is over

    async def deliver_here(chunks: list[int]) -> None:
        request.here.append(chunks)
        request.here_before_made.append(len(request.made))
        if here_fails:
            raise RuntimeError("the provider refused the chunk for good")

    async def recorded_count(request_id: str) -> int:
        return len(ended) if time.monotonic() - started >= seconds else 0

    async def recorded(request_id: str) -> set[int]:
        return ended

    monkeypatch.setattr(fan_out, "_start_share", start_share)
    monkeypatch.setattr(fan_out, "_still_running", still_running)
    monkeypatch.setattr(fan_out, "recorded_chunk_count", recorded_count)
    monkeypatch.setattr(fan_out, "recorded_chunks", recorded)
    monkeypatch.setattr(artifacts, "Progress", lambda **kwargs: _Bar())
    plan = plan_of(shares, recorded=already)
    missing = await fan_out.fan_out(plan, per_run=1, live=live, deliver_here=deliver_here)
    assert missing == set(range(shares)) - ended
    return request


async def _reads_of_runs(
    monkeypatch: pytest.MonkeyPatch, *, shares: int, live: int, seconds: float
) -> list[float]:
    """When the share runs were read (see ``_fan_out``)."""
    request = await _fan_out(monkeypatch, shares=shares, live=live, seconds=seconds)
    assert len(request.made) == min(shares - 1, live)  # no run ended: no share replaced
    return request.reads


async def test_the_first_share_is_delivered_by_the_request_at_once_and_never_made_a_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    request = await _fan_out(monkeypatch, shares=4, live=8, seconds=0.1)
    assert request.here == [[0]]
    assert request.here_before_made == [0]  # not after the other shares' runs are made
    assert request.made == [[1], [2], [3]]


async def test_a_failed_first_share_leaves_its_chunks_missing_and_the_share_runs_going(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Like a failed share run's, its chunks are delivered again by the request at the end
    # (``_fan_out`` checks chunk 0 is returned missing), not the whole request failed
    # while its share runs still send.
    request = await _fan_out(monkeypatch, shares=4, live=8, seconds=0.3, here_fails=True)
    assert request.here == [[0]]
    assert request.made == [[1], [2], [3]]
    assert len(request.reads) >= 1  # it waited for the share runs to end


async def test_a_taken_over_request_delivers_only_what_its_first_share_misses(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Per run of 1 chunk, the first share is chunk 0: recorded, nothing left of it here;
    # the share of chunk 2, recorded too, is not made again.
    request = await _fan_out(monkeypatch, shares=4, live=8, seconds=0.1, already=frozenset({0, 2}))
    assert request.here == [[]]
    assert request.made == [[1], [3]]


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


async def test_a_failure_making_share_runs_lets_the_requests_own_chunk_end_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prefect refusing a share run fails the request; the chunk its run is sending ends
    # (and records its answers) before, never cut off mid-send.
    ended: list[int] = []

    async def start_share(plan: DeliveryPlan, share: list[int]) -> uuid.UUID:
        await asyncio.sleep(0.01)
        raise RuntimeError("Prefect refused the share run")

    async def deliver_here(chunks: list[int]) -> None:
        await asyncio.sleep(0.2)  # a chunk under way
        ended.extend(chunks)

    monkeypatch.setattr(fan_out, "_start_share", start_share)
    with pytest.raises(RuntimeError, match="refused"):
        await fan_out.fan_out(plan_of(3), per_run=1, live=8, deliver_here=deliver_here)
    assert ended == [0]
