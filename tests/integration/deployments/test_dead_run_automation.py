"""The dead-run automation (``register.zombie_automation``) on a real Prefect server.

A run claimed (Pending) that then neither sends a heartbeat nor comes to rest within the
limit is marked dead, whether its worker died before or after the run started; a run
that completes, or keeps sending heartbeats past the limit, is left alone; a run claimed
again after it came to rest (a retry) is watched anew, and so is a run claimed before the
automation was created (``register.watch_claimed_runs``: an upgrade that replaces it),
every one of them though runs come to rest while they are read. Workers starting at once
leave one automation (``register.ensure_automation``). The
automation is the test's own copy, on a deployment of its own, with a limit of a few
seconds."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

import pytest
from prefect import flow, get_client
from prefect.client.orchestration import PrefectClient
from prefect.client.schemas.objects import FlowRun
from prefect.states import AwaitingRetry, Completed, Pending, Running

from campaign_trigger.deployments import heartbeats, register, upkeep
from campaign_trigger.services import prefect_runs
from support import ManagedProcess

WITHIN = 10  # seconds, the least Prefect allows; it evaluates such triggers every 5 s
FLOW_NAME = f"dead-run-automation-{uuid.uuid4().hex[:8]}"


@flow(name=FLOW_NAME)
async def watched() -> None:
    """Never executed: the test moves its runs' states itself."""


async def _states(client: PrefectClient, run: FlowRun) -> list[tuple[str, str]]:
    return [(s.type.value, s.name or "") for s in await client.read_flow_run_states(run.id)]


async def _dead(client: PrefectClient, run: FlowRun) -> bool:
    return ("CRASHED", prefect_runs.DEAD_RUN_STATE_NAME) in await _states(client, run)


async def _beat(client: PrefectClient, run: FlowRun, seconds: float) -> None:
    """The run's heartbeats, as a worker posts them, every second for ``seconds``."""
    for _ in range(int(seconds)):
        event = heartbeats.heartbeat(run, FLOW_NAME).model_dump(mode="json")
        await client.request("POST", "/events", json=[event])
        await asyncio.sleep(1)


async def test_a_claimed_run_silent_past_the_limit_is_marked_dead_and_no_other(
    prefect_server: ManagedProcess,
) -> None:
    async with get_client() as client:
        deployment_id = await (await watched.ato_deployment(name="watched")).aapply()
        before = await client.create_flow_run_from_deployment(deployment_id)
        await client.set_flow_run_state(before.id, Pending())
        await client.set_flow_run_state(before.id, Running())
        automation = register.zombie_automation(
            deployment_ids=[str(deployment_id)], within_seconds=WITHIN
        ).model_copy(update={"name": f"test: {FLOW_NAME}"})
        automation_id = await client.create_automation(automation)
        try:
            assert await register.watch_claimed_runs(client, [str(deployment_id)]) == 1
            names = ("claimed", "started", "completed", "beating", "retried")
            runs = {
                name: await client.create_flow_run_from_deployment(deployment_id) for name in names
            }
            runs["claimed before the automation"] = before
            for name in names:
                await client.set_flow_run_state(runs[name].id, Pending())
            for name in ("started", "completed", "beating", "retried"):
                await client.set_flow_run_state(runs[name].id, Running())
            for name in ("completed", "retried"):
                await client.set_flow_run_state(runs[name].id, Completed())
            # Claimed again at once, its bucket from the first claim still open.
            retried = runs["retried"].id
            await client.set_flow_run_state(retried, AwaitingRetry(), force=True)
            await client.set_flow_run_state(retried, Pending())
            await client.set_flow_run_state(retried, Running())

            await _beat(client, await client.read_flow_run(runs["beating"].id), 3 * WITHIN)
            verdicts = {name: await _dead(client, run) for name, run in runs.items()}
            assert verdicts == {
                "claimed": True,
                "started": True,
                "completed": False,
                "beating": False,
                "retried": True,
                "claimed before the automation": True,
            }, {name: await _states(client, run) for name, run in runs.items()}
        finally:
            await client.delete_automation(automation_id)


async def test_workers_starting_at_once_leave_one_automation_of_the_current_version(
    prefect_server: ManagedProcess,
) -> None:
    """Four starts at the same moment leave one automation, and a start removes an earlier
    version's and a copy left before (each start read none current and created its own:
    before ``ensure_automation`` converged, all four copies stayed, each marking every dead
    run and costing the server its trigger's work)."""
    deployment_ids, name = [str(uuid.uuid4())], f"test: {FLOW_NAME} started at once"
    wanted, older = (
        register.zombie_automation(deployment_ids=deployment_ids, within_seconds=within).model_copy(
            update={"name": name}
        )
        for within in (WITHIN, 2 * WITHIN)
    )
    async with get_client() as client:
        try:
            created = await asyncio.gather(
                *(register.ensure_automation(client, wanted) for _ in range(4))
            )
            left = await client.read_automations_by_name(wanted.name)
            assert [a.trigger for a in left] == [wanted.trigger], created
            # An earlier version's and a copy left by such starts before this version.
            await client.create_automation(older)
            await client.create_automation(wanted)
            assert not await register.ensure_automation(client, wanted)
            assert [a.trigger for a in await client.read_automations_by_name(wanted.name)] == [
                wanted.trigger
            ]
        finally:
            for automation in await client.read_automations_by_name(wanted.name):
                await client.delete_automation(automation.id)


class _RestingBetweenPages:
    """The real client, through which the runs of each page read come to rest as soon as
    it is read (a worker finishing them meanwhile), and which keeps the events posted."""

    def __init__(self, client: PrefectClient, resting: int) -> None:
        self._client, self._resting, self.posted = client, resting, list[dict[str, Any]]()

    async def read_flow_runs(self, **kwargs: Any) -> list[FlowRun]:
        page = await self._client.read_flow_runs(**kwargs)
        for run in page[: self._resting]:
            await self._client.set_flow_run_state(run.id, Completed())
        return page

    async def request(self, method: Any, path: Any, json: list[dict[str, Any]]) -> Any:
        self.posted.extend(json)
        return await self._client.request(method, path, json=json)


async def test_every_claimed_run_is_named_though_runs_come_to_rest_between_pages(
    prefect_server: ManagedProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Paged by an offset, a run coming to rest between two pages shifted the next page by
    one run, never named (here one of the six, pages of two, the first run of each page
    completed as it is read)."""
    monkeypatch.setattr(register, "_PAGE", 2)
    async with get_client() as client:
        deployment_id = await (await watched.ato_deployment(name="paged")).aapply()
        runs = [await client.create_flow_run_from_deployment(deployment_id) for _ in range(6)]
        for run in runs:
            await client.set_flow_run_state(run.id, Pending())
        spy = _RestingBetweenPages(client, resting=1)
        named = await register.watch_claimed_runs(cast(PrefectClient, spy), [str(deployment_id)])
    assert named == 6
    assert {e["resource"]["prefect.resource.id"] for e in spy.posted} == {
        f"prefect.flow-run.{run.id}" for run in runs
    }


async def test_runs_whose_watch_came_before_the_new_automation_are_watched_again_once_loaded(
    prefect_server: ManagedProcess,
) -> None:
    """A start that created the automation watches the runs claimed at once, and that
    watch can reach the triggers service before the automation, which it loads by itself
    (up to 5 s later): the watch of a run whose worker is already dead was then lost for
    good. Here each run's first watch is posted before the automation exists (lost), then
    one deployment's runs are watched again as after a start that created it: its run is
    marked dead, the other's (a start that kept the automation watches nothing again)
    is not."""
    async with get_client() as client:
        again, kept = [
            await (await watched.ato_deployment(name=name)).aapply()
            for name in ("watched again", "kept")
        ]
        runs = {}
        for deployment_id in (again, kept):
            run = runs[deployment_id] = await client.create_flow_run_from_deployment(deployment_id)
            await client.set_flow_run_state(run.id, Pending())
            await client.set_flow_run_state(run.id, Running())
        assert await register.watch_claimed_runs(client, [str(again), str(kept)]) == 2
        automation = register.zombie_automation(
            deployment_ids=[str(again), str(kept)], within_seconds=WITHIN
        ).model_copy(update={"name": f"test: {FLOW_NAME} loaded"})
        try:
            assert await register.ensure_automation(client, automation)
            started = asyncio.get_running_loop().time()
            await asyncio.gather(
                upkeep.watch_again_once_loaded(
                    register.Registered([str(again)], automation_created=True),
                    asyncio.Event(),
                    after=1.0,
                ),
                upkeep.watch_again_once_loaded(
                    register.Registered([str(kept)], automation_created=False), asyncio.Event()
                ),
            )
            assert asyncio.get_running_loop().time() - started < 5  # not the default 15 s
            for _ in range(3 * WITHIN):
                if await _dead(client, runs[again]):
                    break
                await asyncio.sleep(1)
            await asyncio.sleep(6)  # the trigger's next look, which would mark the other too
            verdicts = {
                name: await _dead(client, runs[d]) for name, d in (("again", again), ("kept", kept))
            }
            assert verdicts == {"again": True, "kept": False}
        finally:
            for found in await client.read_automations_by_name(automation.name):
                await client.delete_automation(found.id)
