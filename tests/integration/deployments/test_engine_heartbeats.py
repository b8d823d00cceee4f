"""In a worker process Prefect's engine sends no heartbeat of its own: the process sends
its runs' heartbeats itself (``deployments/heartbeats.py``). Prefect 3.8's default
(every 180 s) started a thread for every run and sent a heartbeat as the run started."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from prefect import flow, flow_engine
from prefect.client.schemas.objects import State
from prefect.events import emit_event
from prefect.flow_engine import run_flow_async
from prefect.settings import temporary_settings

from campaign_trigger.deployments.worker import engine_settings
from support import ManagedProcess


@flow
async def half_a_second() -> None:
    await asyncio.sleep(0.5)  # Prefect's thread would beat at once, and again in 180 s


@pytest.mark.parametrize(
    ("settings", "beats"), [(engine_settings(0.5), 0), ({}, 1)], ids=["worker", "prefect"]
)
async def test_prefects_engine_beats_under_its_defaults_and_not_in_a_worker(
    prefect_server: ManagedProcess,
    monkeypatch: pytest.MonkeyPatch,
    settings: dict[Any, Any],
    beats: int,
) -> None:
    emitted: list[str] = []

    def recording(*, event: str, **fields: Any) -> Any:
        emitted.append(event)
        return emit_event(event=event, **fields)

    monkeypatch.setattr(flow_engine, "emit_event", recording)
    with temporary_settings(settings):
        state = await run_flow_async(half_a_second, return_type="state")
    assert isinstance(state, State)
    assert state.is_completed()
    assert emitted.count("prefect.flow-run.heartbeat") == beats, emitted
