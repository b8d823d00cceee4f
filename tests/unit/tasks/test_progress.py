"""A delivery's progress bar: made and updated off the delivery's path, at most once
every ``Progress.EVERY_SECONDS`` with the latest count, the last count shown at once on
close."""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from typing import Any

import pytest

from campaign_trigger.tasks import artifacts


async def test_updates_are_spaced_carry_the_latest_count_and_close_shows_the_last_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    updates: list[tuple[float, str]] = []

    async def update(artifact_id: uuid.UUID, *, progress: float, description: str) -> Any:
        await asyncio.sleep(0.01)  # a round trip to the Prefect API
        updates.append((time.monotonic(), description))

    async def make(*, progress: float, description: str) -> uuid.UUID:
        return uuid.uuid4()

    monkeypatch.setattr(artifacts, "acreate_progress_artifact", make)
    monkeypatch.setattr(artifacts, "aupdate_progress_artifact", update)
    monkeypatch.setattr(artifacts.Progress, "EVERY_SECONDS", 0.2)
    progress = artifacts.Progress(chunk_count=30, done=0)
    started = time.monotonic()
    for done in range(1, 31):  # a chunk ends every 20 ms or more
        progress.show(done)
        await asyncio.sleep(0.02)
    shown_by_then = len(updates)
    elapsed = time.monotonic() - started
    await progress.close()
    closed = time.monotonic()

    # one update per 0.2 s of the chunks (however slow the machine), not one per chunk
    assert 1 <= shown_by_then <= elapsed / 0.2 + 1, (elapsed, updates)
    assert shown_by_then < 15, updates
    spaced = [started, *(at for at, _ in updates[:-1])]  # the last one: on close
    assert all(b - a >= 0.19 for a, b in itertools.pairwise(spaced)), spaced
    assert updates[-1][1] == "Chunks delivered (30/30)"
    assert closed - updates[-1][0] < 0.1  # close did not wait out the 0.2 s interval
    counts = [int(d.split("(")[1].split("/")[0]) for _, d in updates]
    assert counts == sorted(counts)


async def test_the_first_chunk_does_not_wait_for_the_artifact_to_be_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made, updated = asyncio.Event(), []
    artifact_id = uuid.uuid4()

    async def make(*, progress: float, description: str) -> uuid.UUID:
        await asyncio.sleep(0.3)  # a slow Prefect API
        made.set()
        return artifact_id

    async def update(shown: uuid.UUID, *, progress: float, description: str) -> Any:
        assert made.is_set()
        updated.append((shown, description))

    monkeypatch.setattr(artifacts, "acreate_progress_artifact", make)
    monkeypatch.setattr(artifacts, "aupdate_progress_artifact", update)
    progress = artifacts.Progress(chunk_count=2, done=0)
    progress.show(1)  # the first chunk ended before the artifact was made
    assert not made.is_set()  # start did not wait for it
    progress.show(2)
    await progress.close()  # waits for the artifact, then shows the last count at once
    assert made.is_set()
    assert updated == [(artifact_id, "Chunks delivered (2/2)")]


async def test_a_progress_bar_the_api_refused_to_make_never_fails_the_delivery(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    async def make(*, progress: float, description: str) -> uuid.UUID:
        raise RuntimeError("the Prefect API is down")

    async def update(shown: uuid.UUID, *, progress: float, description: str) -> Any:
        raise AssertionError("nothing to update")

    monkeypatch.setattr(artifacts, "acreate_progress_artifact", make)
    monkeypatch.setattr(artifacts, "aupdate_progress_artifact", update)
    progress = artifacts.Progress(chunk_count=2, done=0)
    progress.show(1)
    progress.show(2)
    await progress.close()
