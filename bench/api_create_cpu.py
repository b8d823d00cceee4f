"""The API's CPU per create, in process: load-independent evidence for a cut.

Starts a private stack (Prefect server, deployments), builds the API application with
its lifespan (the outbox drainer and the shared Prefect client run on this process's
loop, as in ``campaign-trigger api``) and calls it straight through ASGI (no socket,
no uvicorn, the bodies prebuilt), one call after another, with the operations of
``bench/api_creates.py``: in every ten, eight creates of 100 JSON messages (``send_at``
an hour ahead), one scheduled list, one cancel. Prints this process's CPU time per
create over the mix (the drainer's work on the outbox included, the Prefect server's
not), then each operation alone: a create, its flow run through the outbox, a list
(page of 50 x 100 messages), a cancel (least of three rounds each).

``--profile FILE`` then runs 200 creates, 10 lists and 10 cancels under cProfile with
the worker-thread hops made in place, into ``FILE.create.pstats`` (``.list``,
``.cancel``; read them with ``python -m pstats``); the CPU figures are from the real
thread hops.

Usage: ``.venv/bin/python bench/api_create_cpu.py [--cycles 40] [--profile FILE]
[--postgres]``. CPU time, not wall-clock time: it holds on a loaded machine, within a
few tenths of a ms per create (the list within a few ms).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from harness import POSTGRES, member_token, postgres_database, private_stack, seed_audience

MESSAGES = 100


class AsgiCaller:
    """Calls an ASGI application in process; answers (status, body bytes)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.auth = f"Bearer {token}".encode()

    async def call(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        headers = [(b"host", b"testserver"), (b"authorization", self.auth)]
        if body:
            headers += [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ]
        path, _, query = path.partition("?")
        scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": path,
            "raw_path": path.encode(),
            "query_string": query.encode(),
            "root_path": "",
            "headers": headers,
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        sent = False

        async def receive() -> dict[str, Any]:
            nonlocal sent
            if sent:
                await asyncio.sleep(3600)
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        status = 0
        chunks: list[bytes] = []

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body":
                chunks.append(message.get("body", b""))

        await self.app(scope, receive, send)
        return status, b"".join(chunks)


def create_body(campaign_id: str, users: list[str], n: int) -> bytes:
    """The create of bench/api_creates.py: 100 messages, two variables, an hour ahead."""
    from datetime import UTC, datetime, timedelta

    send_at = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    messages = [
        {
            "user_id": users[(n * MESSAGES + k) % len(users)],
            "template_variables": {"first_name": f"Ada{k}", "order_id": f"A-{n}-{k}"},
        }
        for k in range(MESSAGES)
    ]
    return json.dumps(
        {"campaign_id": campaign_id, "send_at": send_at, "messages": messages}
    ).encode()


def cpu_per_call(
    loop: asyncio.AbstractEventLoop, calls: list[Callable[[], Awaitable[None]]]
) -> float:
    """Process CPU seconds per call, calls made one after another."""
    before = time.process_time()
    for call in calls:
        loop.run_until_complete(call())
    return (time.process_time() - before) / len(calls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cycles", type=int, default=40, help="cycles of ten operations")
    parser.add_argument("--profile", type=Path, help="cProfile stats to FILE.*.pstats")
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    with ExitStack() as stack:
        settings: dict[str, str] = {}
        if args.postgres:
            settings["CT_DATABASE_URL"] = f"{POSTGRES}/{stack.enter_context(postgres_database())}"
        stack.enter_context(private_stack(**settings))
        from campaign_trigger.api.app import create_app

        audience = seed_audience(MESSAGES * 10)
        app = create_app()
        caller = AsgiCaller(app, member_token(audience.org_id))
        campaign, users = audience.campaign_id, audience.users
        loop = asyncio.new_event_loop()
        lifespan = app.router.lifespan_context(app)
        loop.run_until_complete(lifespan.__aenter__())
        created: list[str] = []
        serial = iter(range(10**9))

        async def create() -> None:
            body = create_body(campaign, users, next(serial))
            status, answer = await caller.call("POST", "/api/campaigns/trigger", body)
            if status != 200:
                sys.exit(f"create answered {status}: {answer!r}")
            created.append(json.loads(answer)["request_id"])

        async def listing() -> None:
            status, answer = await caller.call(
                "GET", f"/api/campaigns/{campaign}/request/scheduled"
            )
            if status != 200:
                sys.exit(f"list answered {status}: {answer!r}")

        async def cancel() -> None:
            status, answer = await caller.call(
                "PUT", f"/api/campaigns/request/{created.pop(0)}/cancel"
            )
            if status != 200:
                sys.exit(f"cancel answered {status}: {answer!r}")

        cycle = [create] * 4 + [listing] + [create] * 4 + [cancel]
        bodies = cpu_per_call(loop, [lambda: _noop(campaign, users, serial)] * 200)
        cpu_per_call(loop, [create] * 20)  # warm-up
        drained(loop)
        before = time.process_time()
        for _ in range(args.cycles):
            cpu_per_call(loop, cycle)
        drained(loop)
        mix = (time.process_time() - before) / (8 * args.cycles) - bodies
        creates = least(loop, [create] * 50) - bodies
        before = time.process_time()
        drained(loop)
        drain = (time.process_time() - before) / 150
        lists = least(loop, [listing] * 10)
        cancels = least(loop, [cancel] * 10)
        database = "PostgreSQL" if args.postgres else "SQLite"
        print(
            f"{database}: in the mix (8 creates, 1 list, 1 cancel, outbox drained) "
            f"{mix * 1000:.2f} ms of CPU per create; a create alone {creates * 1000:.2f} ms, "
            f"its flow run through the outbox {drain * 1000:.2f} ms, a list "
            f"{lists * 1000:.2f} ms ({len(created)} scheduled), a cancel "
            f"{cancels * 1000:.2f} ms",
            flush=True,
        )
        if args.profile:
            _profile(loop, [create] * 200, args.profile.with_suffix(".create.pstats"))
            _profile(loop, [listing] * 10, args.profile.with_suffix(".list.pstats"))
            _profile(loop, [cancel] * 10, args.profile.with_suffix(".cancel.pstats"))
        loop.run_until_complete(lifespan.__aexit__(None, None, None))
        loop.close()


def least(loop: asyncio.AbstractEventLoop, calls: list[Callable[[], Awaitable[None]]]) -> float:
    """The least CPU per call of three rounds of ``calls`` (the others ran beside more load)."""
    return min(cpu_per_call(loop, calls) for _ in range(3))


def drained(loop: asyncio.AbstractEventLoop) -> None:
    """Wait (on the loop, so that the API's outbox drainer runs) for an empty outbox."""
    from campaign_trigger.services.scheduling import outbox_depth
    from campaign_trigger.store.db import session_scope

    def depth() -> int:
        with session_scope() as session:
            return outbox_depth(session=session)

    while depth():
        loop.run_until_complete(asyncio.sleep(0.1))


async def _noop(campaign: str, users: list[str], serial: Any) -> None:
    create_body(campaign, users, next(serial))


def _profile(
    loop: asyncio.AbstractEventLoop, calls: list[Callable[[], Awaitable[None]]], out: Path
) -> None:
    """cProfile of ``calls`` with the thread hops made in place."""
    import anyio.to_thread

    async def in_place(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("limiter", None)
        return function(*args, **kwargs)

    real = anyio.to_thread.run_sync
    anyio.to_thread.run_sync = in_place  # type: ignore[assignment]
    real_to_thread = asyncio.to_thread
    asyncio.to_thread = in_place  # type: ignore[assignment]
    try:
        profiler = cProfile.Profile()
        profiler.enable()
        for call in calls:
            loop.run_until_complete(call())
        profiler.disable()
    finally:
        anyio.to_thread.run_sync = real  # type: ignore[assignment]
        asyncio.to_thread = real_to_thread  # type: ignore[assignment]
    profiler.dump_stats(out)
    print(f"profile of {len(calls)} calls: {out}", flush=True)


if __name__ == "__main__":
    main()
