"""An API server process freezes what it loaded at its start for the garbage collector
(``heap.settle``, in the served application's start-up): answering calls, it makes a
young pass now and then and no full pass over its ~260,000 objects."""

from __future__ import annotations

import asyncio
import re

import httpx
from api_tenants import Server, Tenant

_PASSES = re.compile(r'^python_gc_collections_total\{generation="(\d)"\} (\S+)$', re.MULTILINE)
CALLS, AT_ONCE = 400, 10


def passes(url: str) -> dict[int, float]:
    """The collector's passes so far by generation, from the process's ``/metrics``."""
    page = httpx.get(f"{url}/metrics").text
    return {int(generation): float(count) for generation, count in _PASSES.findall(page)}


async def test_a_served_api_answering_calls_makes_few_young_passes_and_no_full_one(
    api_server: Server, tenant: Tenant
) -> None:
    before = passes(api_server.url)
    async with httpx.AsyncClient(base_url=api_server.url, headers=tenant.auth()) as client:

        async def list_scheduled() -> None:
            listed = await client.get(f"/api/campaigns/{tenant.started}/request/scheduled")
            assert listed.status_code == 200, listed.text

        for _ in range(CALLS // AT_ONCE):
            await asyncio.gather(*(list_scheduled() for _ in range(AT_ONCE)))
    after = passes(api_server.url)
    # a young pass every 50,000 allocations; with CPython's default thresholds (every
    # 700) these calls made ~90 young passes
    assert after[0] - before[0] <= 3, (before, after)
    assert after[2] == before[2], (before, after)
