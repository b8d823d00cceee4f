"""A request fanning out: it delivers shares itself, from the first, at once, and offers
shares from the last back as runs for other workers, one more than were claimed since it
last looked; and how often it reads its shares' runs from Prefect: every
``WAIT_SECONDS`` while shares are left to offer, every ``ENDED_SECONDS`` once none is
(only to notice one that failed), and never right after making them."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Iterator

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
    """What a fanning-out request did: the share runs it made (and how many were made
    when its first chunk started), when it read them, and the chunks it delivered
    itself, each with whether it was the last (its place handed on)."""

    def __init__(self) -> None:
        self.made: list[list[int]] = []
        self.reads: list[float] = []
        self.here: list[tuple[int, bool]] = []
        self.made_at_first_chunk: int | None = None
        self.most_not_ended = 0
        self.counts: list[float] = []  # when it counted the recorded chunks
        self.here_ended = 0.0

    @property
    def here_chunks(self) -> list[int]:
        return [chunk_no for chunk_no, _ in self.here]


async def _fan_out(
    monkeypatch: pytest.MonkeyPatch,
    *,
    shares: int,
    live: int = 8,
    seconds: float,
    chunk_seconds: float = 0.0,
    claimed: bool = False,
    already: frozenset[int] = frozenset(),
    made_before: dict[int, uuid.UUID] | None = None,
    here_fails: bool = False,
    recorded_seconds: float = 0.01,
    ended_beside: tuple[float, ...] = (),
) -> _Request:
    """A request of ``shares`` shares of one chunk each (``live`` runs not ended at a
    time), each chunk it delivers itself taking ``chunk_seconds``, for ``seconds``:
    until then no share run ends. If ``claimed``, a worker claims every offer before the
    next read (else nobody does: the request's worker is alone and busy with it).
    ``already`` recorded, ``made_before`` the share runs a run before it made (taken
    over). If ``here_fails``, the first chunk it delivers itself fails for good. A chunk of
    the request ends in this process (a share run beside it) at each of ``ended_beside``
    (seconds), recorded by then."""
    monkeypatch.setattr(fan_out, "RECORDED_SECONDS", recorded_seconds)
    monkeypatch.setattr(fan_out, "WAIT_SECONDS", 0.05)
    monkeypatch.setattr(fan_out, "ENDED_SECONDS", 0.25)
    started = time.monotonic()
    request = _Request()
    offers: set[uuid.UUID] = set()

    async def shares_made(run_id: uuid.UUID | None) -> dict[int, uuid.UUID]:
        return dict(made_before or {})

    async def start_share(plan: DeliveryPlan, share: list[int]) -> uuid.UUID:
        await asyncio.sleep(0.01)  # a call to the Prefect server
        request.made.append(share)
        run_id = uuid.uuid4()
        offers.add(run_id)
        return run_id

    async def not_ended(run_ids: list[uuid.UUID]) -> dict[uuid.UUID, bool]:
        request.reads.append(time.monotonic() - started)
        request.most_not_ended = max(request.most_not_ended, len(run_ids))
        if claimed:
            offers.clear()
        if time.monotonic() - started >= seconds:
            return {}
        return {run_id: run_id in offers for run_id in run_ids}

    failed: set[int] = set()

    async def deliver_here(chunks: Iterator[tuple[int, bool]]) -> None:
        for chunk_no, last in chunks:
            if request.made_at_first_chunk is None:
                request.made_at_first_chunk = len(request.made)
            request.here.append((chunk_no, last))
            await asyncio.sleep(chunk_seconds)
            if here_fails:
                failed.add(chunk_no)
                raise RuntimeError("the provider refused the chunk for good")
        request.here_ended = time.monotonic() - started

    async def recorded_count(request_id: str) -> int:
        request.counts.append(time.monotonic() - started)
        return shares - len(failed) if time.monotonic() - started >= seconds else 0

    async def recorded(request_id: str) -> set[int]:
        return set(range(shares)) - failed

    monkeypatch.setattr(fan_out, "_shares_made", shares_made)
    monkeypatch.setattr(fan_out, "_start_share", start_share)
    monkeypatch.setattr(fan_out, "_not_ended", not_ended)
    monkeypatch.setattr(fan_out, "recorded_chunk_count", recorded_count)
    monkeypatch.setattr(fan_out, "recorded_chunks", recorded)
    monkeypatch.setattr(artifacts, "Progress", lambda **kwargs: _Bar())
    plan = plan_of(shares, recorded=already)

    async def chunks_beside() -> None:
        for at in ended_beside:
            await asyncio.sleep(at - (time.monotonic() - started))
            fan_out.chunk_ended(plan.request_id)

    beside = asyncio.create_task(chunks_beside())
    missing = await fan_out.fan_out(plan, per_run=1, live=live, deliver_here=deliver_here)
    await beside
    assert missing == failed
    # no share both delivered here and made a run, nor one delivered here twice
    here = request.here_chunks
    assert len(set(here)) == len(here), here
    assert not set(here) & {c for share in request.made for c in share}, (here, request.made)
    return request


async def test_a_worker_alone_makes_one_share_run_and_delivers_the_others_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Nobody claims the offer (the request's worker has no room while the request's run
    # sends): one share run, the last share, instead of one per share after the first,
    # each costing the Prefect server what a one-message request does.
    request = await _fan_out(monkeypatch, shares=5, seconds=0.3, chunk_seconds=0.02)
    assert request.made == [[4]]
    assert request.made_at_first_chunk == 0  # its first chunk did not wait for a share run
    # one share after the other, the place handed on (to the share run offered) only at
    # the very last chunk
    assert request.here == [(0, False), (1, False), (2, False), (3, True)]


async def test_each_claimed_offer_is_replaced_by_one_more_from_the_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Workers with room claim every offer: one more is offered at each look than were
    # claimed (1, then 2, then 3...), from the last share back, while the request's run
    # goes on from the front; between them every share is delivered once.
    request = await _fan_out(monkeypatch, shares=12, seconds=0.5, chunk_seconds=0.05, claimed=True)
    assert request.made == [[k] for k in range(11, 11 - len(request.made), -1)]
    assert len(request.made) >= 6, request.made  # 1 + 2 + 3 by the third look
    assert sorted(request.here_chunks + [s[0] for s in request.made]) == list(range(12))
    assert request.here[-1][1]  # its last chunk hands the place on
    assert [last for _, last in request.here[:-1]] == [False] * (len(request.here) - 1)


async def test_at_most_live_share_runs_are_not_ended(monkeypatch: pytest.MonkeyPatch) -> None:
    # Claimed at once and never ending: no more than two runs, the request's run does
    # the rest.
    request = await _fan_out(
        monkeypatch, shares=8, live=2, seconds=0.5, chunk_seconds=0.03, claimed=True
    )
    assert request.made == [[7], [6]]
    assert request.most_not_ended <= 2
    assert request.here_chunks == list(range(6))


async def test_a_failed_share_of_its_own_leaves_its_chunk_missing_and_the_rest_offered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Like a failed share run's, its chunks are delivered again by the request at the end
    # (``_fan_out`` checks chunk 0 is returned missing), not the whole request failed
    # while its share runs still send; the shares it had not taken go to share runs.
    request = await _fan_out(monkeypatch, shares=4, seconds=0.4, claimed=True, here_fails=True)
    assert request.here == [(0, False)]
    assert sorted(request.made) == [[1], [2], [3]]
    assert len(request.reads) >= 2  # it waited for the share runs to end


async def test_a_taken_over_request_leaves_the_share_runs_made_and_the_recorded_be(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Its run before the takeover made the share run of chunk 1 (maybe still running on
    # another worker), chunks 0 and 2 are recorded: it delivers chunk 3 and offers 4.
    found = uuid.uuid4()
    request = await _fan_out(
        monkeypatch,
        shares=5,
        seconds=0.2,
        already=frozenset({0, 2}),
        made_before={1: found},
    )
    assert request.here == [(3, True)]
    assert request.made == [[4]]


async def test_with_no_share_left_to_offer_the_runs_are_read_every_ended_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two shares: its own and the one offered; nothing left to offer.
    request = await _fan_out(monkeypatch, shares=2, seconds=0.9)
    reads = request.reads
    assert 2 <= len(reads) <= 4, reads  # every 0.25 s over 0.9 s, not every 0.05 s
    assert reads[0] >= 0.2, reads  # not right after the share was made
    assert all(b - a >= 0.2 for a, b in itertools.pairwise(reads)), reads


async def test_with_shares_left_to_offer_and_claimed_the_runs_are_read_every_wait_seconds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The request's run is slow with its own shares: some are left to offer meanwhile,
    # and workers claim each offer.
    request = await _fan_out(
        monkeypatch, shares=12, seconds=0.5, chunk_seconds=0.5, claimed=True, live=2
    )
    assert len(request.reads) >= 5, request.reads  # every 0.05 s (or as often as it can)
    assert request.reads[0] >= 0.04, request.reads


async def test_with_no_offer_claimed_the_runs_are_read_ever_less_often(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Nobody claims the offer (the workers are busy): 0.05 s, then 0.1, 0.2, and at most
    # every 0.25 s (ENDED_SECONDS), not every 0.05 s (a call to the Prefect server each).
    request = await _fan_out(monkeypatch, shares=4, seconds=1.0, chunk_seconds=0.5)
    gaps = [b - a for a, b in itertools.pairwise(request.reads)]
    assert 4 <= len(request.reads) <= 7, request.reads
    assert gaps[0] >= 0.09, gaps
    assert gaps[1] >= 0.18, gaps
    assert all(gap <= 0.35 for gap in gaps), gaps


async def test_the_chunks_are_counted_every_recorded_seconds_only_once_its_own_are_sent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Until its own chunks are sent the request cannot end: the recorded chunks are
    # counted only as the progress is shown (every 0.05 s here), not every 0.01 s (a
    # query in a thread five times a second in a worker, during every chunk).
    request = await _fan_out(monkeypatch, shares=3, seconds=0.8, chunk_seconds=0.25)
    assert request.here_ended >= 0.5
    while_own = [t for t in request.counts if t < request.here_ended]
    after = [t for t in request.counts if t > request.here_ended + 0.02]
    assert len(while_own) <= request.here_ended / 0.05 + 2, while_own
    assert len(after) >= 10, after  # every 0.01 s from 0.52 to 0.8 s
    assert request.counts[-1] - 0.8 < 0.05  # the end noticed at once


async def test_a_chunk_ending_in_this_process_has_the_chunks_counted_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The last share's chunks end in a share run beside the request's (a lone worker):
    # each end has the request count its chunks at once, and it ends with the last one
    # (at 0.8 s), instead of counting every RECORDED_SECONDS (1 s here) and noticing its
    # end up to that late.
    request = await _fan_out(
        monkeypatch,
        shares=3,
        seconds=0.8,
        chunk_seconds=0.2,
        recorded_seconds=1.0,
        ended_beside=(0.6, 0.8),
    )
    assert request.here_ended < 0.6, request.here_ended
    after = [round(t, 2) for t in request.counts if t >= request.here_ended]
    assert request.counts[-1] < 1.2, request.counts  # the last end noticed at once
    assert len(after) <= 3, after  # as its own chunks ended, then at each end beside it


async def test_a_failure_making_share_runs_lets_the_requests_own_chunk_end_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prefect refusing a share run fails the request; the chunk its run is sending ends
    # (and records its answers) before, never cut off mid-send.
    ended: list[int] = []

    async def start_share(plan: DeliveryPlan, share: list[int]) -> uuid.UUID:
        await asyncio.sleep(0.01)
        raise RuntimeError("Prefect refused the share run")

    async def deliver_here(chunks: Iterator[tuple[int, bool]]) -> None:
        for chunk_no, _ in chunks:
            await asyncio.sleep(0.2)  # a chunk under way
            ended.append(chunk_no)
            return

    monkeypatch.setattr(fan_out, "_start_share", start_share)
    with pytest.raises(RuntimeError, match="refused"):
        await fan_out.fan_out(plan_of(3), per_run=1, live=8, deliver_here=deliver_here)
    assert ended == [0]
