"""A worker process frozen long enough to lose its runs stops before it sends again:
the watch's thread finds the freeze out when it wakes, a send when its transport is about
to write (``integration/delivery/test_freeze_transports.py``); an idle process goes on.
So does one whose runs' heartbeats went unanswered for longer than its lease (a process
cut off from Prefect: ``e2e/test_takeover_partition.py``)."""

from __future__ import annotations

import time

import pytest

from campaign_trigger.delivery import freeze
from support import until


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_threshold_is_half_the_shortest_freeze_that_can_get_a_run_marked_dead() -> None:
    # The last heartbeat may be a whole interval old when the process freezes.
    assert freeze.threshold_seconds(dead_after=90, heartbeat_seconds=30) == 30
    assert freeze.threshold_seconds(dead_after=40, heartbeat_seconds=30) == 5


def test_a_send_after_a_freeze_of_the_threshold_stops_and_not_before() -> None:
    clock, frozen = Clock(), list[float]()
    watch = freeze.FreezeWatch(5.0, busy=lambda: True, on_frozen=frozen.append, clock=clock)
    clock.now += freeze.TICK_SECONDS + 4.9  # a tick late by 4.9 s
    watch.check()
    assert frozen == []
    clock.now += 0.2
    watch.check()
    assert frozen == [pytest.approx(5.1)]


def test_the_thread_finds_a_freeze_out_while_runs_are_held() -> None:
    clock, frozen, held = Clock(), list[float](), [True]
    watch = freeze.FreezeWatch(5.0, busy=lambda: held[0], on_frozen=frozen.append, clock=clock)
    with watch.watching():
        time.sleep(3 * freeze.TICK_SECONDS)  # ticks on time: nothing
        assert frozen == []
        clock.now += 60
        until(lambda: frozen)
    assert frozen[0] >= 59


def test_an_idle_process_that_was_frozen_goes_on() -> None:
    clock, frozen = Clock(), list[float]()
    watch = freeze.FreezeWatch(5.0, busy=lambda: False, on_frozen=frozen.append, clock=clock)
    with watch.watching():
        clock.now += 60
        time.sleep(3 * freeze.TICK_SECONDS)  # the thread saw it, and ticked again
        watch.check()  # a run claimed since then sends
    assert frozen == []


def test_sends_still_check_a_watch_when_the_first_of_two_in_a_process_ends() -> None:
    # Two workers in one process (as some tests run them), the first to start ending
    # first: the second's watch still answers the sends' check.
    clock, frozen = Clock(), list[float]()
    first = freeze.FreezeWatch(5.0, busy=lambda: False, on_frozen=frozen.append, clock=clock)
    second = freeze.FreezeWatch(5.0, busy=lambda: False, on_frozen=frozen.append, clock=clock)
    first_running = first.watching()
    first_running.__enter__()
    with second.watching():
        first_running.__exit__(None, None, None)
        clock.now += 30
        freeze.check()
        assert frozen == [pytest.approx(30 - freeze.TICK_SECONDS, abs=0.1)]
    freeze.check()  # no watch left in the process: nothing asked
    assert len(frozen) == 1


def test_the_lease_is_half_the_dead_run_limit_and_outlasts_three_lost_heartbeats() -> None:
    assert freeze.lease_seconds(90) == 45
    assert freeze.run_heartbeat_seconds(90) * 3 < freeze.lease_seconds(90)
    assert freeze.run_heartbeat_seconds(40) == 5
    # a freeze is found out before the lease would have lapsed anyway
    assert freeze.worker_threshold_seconds(40) < freeze.lease_seconds(40)


def test_a_send_after_the_lease_lapsed_stops_and_a_renewal_keeps_it() -> None:
    clock, lapsed = Clock(), list[float]()
    watch = freeze.FreezeWatch(
        1000.0, busy=lambda: True, lease=20.0, on_lapsed=lapsed.append, clock=clock
    )
    clock.now += 15
    watch.renew(clock.now - 1)  # a heartbeat sent a second ago, answered now
    clock.now += 19.5  # 20.5 s after the last answered heartbeat was sent
    watch.check()
    assert lapsed == [pytest.approx(20.5)]
    watch.renew(clock.now - 30)  # an answer to an older heartbeat moves nothing
    lapsed.clear()
    watch.check()
    assert lapsed == [pytest.approx(20.5)]


def test_once_its_lease_lapses_a_process_holding_runs_sends_nothing_new_then_exits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(freeze, "FENCED", False)
    clock, lapsed, held = Clock(), list[float](), [False]
    watch = freeze.FreezeWatch(
        1000.0, busy=lambda: held[0], lease=20.0, grace=5.0, on_lapsed=lapsed.append, clock=clock
    )
    with watch.watching():
        clock.now += 25  # idle: its lease may lapse, it sends nothing
        time.sleep(3 * freeze.TICK_SECONDS)
        assert not freeze.FENCED
        watch.renew(clock.now)  # a run claimed
        held[0] = True
        clock.now += 10
        time.sleep(3 * freeze.TICK_SECONDS)
        assert not freeze.FENCED
        clock.now += 10.5
        until(lambda: freeze.FENCED)  # no new message from now on
        watch.check()  # the messages in flight are still answered and recorded
        held[0] = False  # their run ended meanwhile: the process exits all the same
        time.sleep(3 * freeze.TICK_SECONDS)
        assert lapsed == []
        clock.now += 5
        until(lambda: lapsed)
    assert lapsed[0] == pytest.approx(25.5)


def test_a_write_past_the_lease_and_its_grace_stops(monkeypatch: pytest.MonkeyPatch) -> None:
    # the thread did not get to fence it (the process was frozen, say): the write stops
    clock, lapsed = Clock(), list[float]()
    watch = freeze.FreezeWatch(
        1000.0, busy=lambda: True, lease=20.0, grace=5.0, on_lapsed=lapsed.append, clock=clock
    )
    clock.now += 24.9
    watch.check()
    assert lapsed == []
    clock.now += 0.2
    watch.check()
    assert lapsed == [pytest.approx(25.1)]


def test_renewals_reach_every_watch_of_the_process() -> None:
    clock, lapsed = Clock(), list[float]()
    watch = freeze.FreezeWatch(
        1000.0, busy=lambda: True, lease=20.0, on_lapsed=lapsed.append, clock=clock
    )
    with watch.watching():
        clock.now += 15
        freeze.renew(clock.now)
        clock.now += 15
        freeze.check()
    assert lapsed == []
