"""A provider's send slots: shared by concurrent ``send_many`` calls, never more in flight
than ``concurrency``, first come first served, and no slot lost to a cancelled waiter;
none handed out once the process is fenced."""

from __future__ import annotations

import asyncio

import pytest

from campaign_trigger.delivery import freeze
from campaign_trigger.delivery.base import PushMessage, PushResult
from campaign_trigger.delivery.sending import Slots
from unit.delivery.counting_sender import CountingSender


def _messages(prefix: str, count: int) -> list[PushMessage]:
    return [PushMessage(n, f"{prefix}-{n}", "title", "body", {}) for n in range(count)]


async def test_concurrent_send_many_calls_share_the_slots() -> None:
    sender = CountingSender(concurrency=3)
    recorded: list[str] = []

    async def record(result: PushResult) -> None:
        recorded.append(result.error_message)
        await asyncio.sleep(0)  # the slot is held while the caller records

    batches = await asyncio.gather(
        *(sender.send_many(_messages(name, 20), on_result=record) for name in "abcd")
    )
    assert sender.most_in_flight == 3
    assert [[r.key for r in results] for results in batches] == [list(range(20))] * 4
    assert recorded == [""] * 80
    again = await sender.send_many(_messages("e", 6))  # every slot was given back
    assert len(again) == 6
    assert sender.most_in_flight == 3


async def test_waiters_get_slots_in_order_and_a_cancelled_one_takes_none() -> None:
    slots = Slots(1)
    await slots.acquire()
    order: list[str] = []

    async def wait(name: str) -> None:
        await slots.acquire()
        order.append(name)

    first = asyncio.create_task(wait("first"))
    cancelled = asyncio.create_task(wait("cancelled"))
    last = asyncio.create_task(wait("last"))
    await asyncio.sleep(0)
    cancelled.cancel()
    slots.release()  # to "first"
    await asyncio.sleep(0)
    slots.release()  # to "last", past the cancelled waiter
    await asyncio.gather(first, last, return_exceptions=True)
    assert cancelled.cancelled()
    assert order == ["first", "last"]


async def test_a_slot_handed_to_a_waiter_being_cancelled_goes_to_the_next() -> None:
    slots = Slots(1)
    await slots.acquire()
    got: list[str] = []

    async def wait(name: str) -> None:
        await slots.acquire()
        got.append(name)

    doomed = asyncio.create_task(wait("doomed"))
    heir = asyncio.create_task(wait("heir"))
    await asyncio.sleep(0)
    slots.release()  # handed to "doomed", which is cancelled before it runs
    doomed.cancel()
    await asyncio.gather(doomed, heir, return_exceptions=True)
    assert doomed.cancelled()
    assert got == ["heir"]


async def test_a_fenced_process_starts_no_new_message_and_records_those_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Once the process's lease lapsed (``delivery/freeze.py``) no message is sent that
    was not on its way: the answers to those in flight are still handed to the caller."""
    monkeypatch.setattr(freeze, "FENCED", False)
    sender = CountingSender(concurrency=3)
    recorded: list[PushResult] = []

    async def record(result: PushResult) -> None:
        recorded.append(result)
        monkeypatch.setattr(freeze, "FENCED", True)  # lapsed as the first answer came

    sending = asyncio.ensure_future(sender.send_many(_messages("f", 10), on_result=record))
    await asyncio.sleep(0.2)
    assert not sending.done()  # the process exits at the end of its grace
    sending.cancel()
    assert sender.posts == 3
    assert len(recorded) == 3
