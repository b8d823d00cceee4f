"""End to end: a worker frozen (SIGSTOP) mid-chunk, its request taken over by another
worker, and what the frozen one does as it thaws."""

from __future__ import annotations

import asyncio

import pytest

from campaign_trigger.store.models import Platform
from e2e.conftest import Sandbox, WorkerFactory
from e2e.takeover_support import (
    FREEZE_ENV,
    completed_once,
    exited_as_frozen,
    frozen_mid_chunk,
    marked_dead,
    recorded_so_far,
    taken_over,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


@pytest.mark.parametrize("platform", [Platform.android, Platform.ios])
async def test_a_frozen_worker_whose_run_was_taken_over_exits_as_it_thaws_without_sending(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
    platform: Platform,
) -> None:
    """SIGSTOP in the middle of a chunk, between two writes: the run is marked dead and a
    new worker completes it, as after a kill. Then SIGCONT: the frozen worker still holds
    the run and its chunk in memory, and exits before it begins one more send
    (delivery/freeze.py) instead of sending the rest of its chunk a second time.

    At most one message goes out as it thaws: the request the freeze may have caught
    between its transport's check and its write (over HTTP/1.1 seen once in many runs,
    27 Nov). It was in flight at the freeze; unfenced, the rest of the chunk went (2,620
    messages). Over HTTP/2 libcurl writes many streams in one turn: before each body
    was read through a check, 6 and 36 messages went out in two runs of five (28 Nov)."""
    frozen = await frozen_mid_chunk(start_worker, sandbox, writing=False, platform=platform)
    await taken_over(start_worker, sandbox, frozen, env=FREEZE_ENV)
    sent = len(sandbox.state.deliveries)
    frozen.worker.thaw()
    await asyncio.sleep(3.0)  # what it would send goes out at once
    again = len(sandbox.state.deliveries) - sent
    assert again <= 1, f"{again} sent after the thaw:\n{frozen.worker.log_tail()}"
    exited_as_frozen(frozen.worker)


async def test_a_worker_frozen_while_writing_holds_its_takeover_until_it_thaws_and_exits(
    start_worker: WorkerFactory,
    sandbox: Sandbox,
) -> None:
    """SIGSTOP in the middle of a chunk, while the worker holds SQLite's write lock: the
    run is marked dead and another worker claims it, but records nothing (its writes
    wait for the lock) until SIGCONT. Then the frozen worker exits before it sends again,
    its lock goes with it, and the taker completes the request: nobody missing, at most
    the messages in flight at the freeze sent twice."""
    frozen = await frozen_mid_chunk(start_worker, sandbox, writing=True)
    start_worker(**FREEZE_ENV)
    await marked_dead(frozen.request_id)
    await asyncio.sleep(3.0)  # the taker's sweep (every 2 s) claims it; its writes wait
    assert recorded_so_far(frozen.request_id) == (frozen.chunks, frozen.recorded)
    frozen.worker.thaw()
    exited_as_frozen(frozen.worker)
    await completed_once(sandbox, frozen)
