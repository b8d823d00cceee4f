"""A worker process frozen long enough to lose its runs stops before it sends again.

Prefect marks a delivery run dead when its heartbeats (every ``heartbeat_seconds``, from
a thread of the worker process) stop for ``CT_DEAD_RUN_AFTER_SECONDS``, and another
worker takes the run over, sending again what was sent and not recorded. A process
that was only frozen (SIGSTOP, a paused VM or container, a host swapping) and then
resumes still holds that run in memory: unfenced, it would go on with its chunk and the
chunks after it beside the worker that took them over, each of those messages twice.

:class:`FreezeWatch` is the fence. A thread notes the time every ``TICK_SECONDS``. A
freeze of ``threshold`` seconds or more (half the shortest freeze that can get a run
marked dead) is found out by whichever runs first once the process resumes: the thread,
waking that much later than it meant to, or a transport about to write (:func:`check`,
called by each of them right before its bytes go to the socket: after every await a send
makes, a token's or a new connection's, so a send frozen in one of them is stopped
too), finding the last tick that old. Either way the process exits at once
(:data:`EXIT_CODE`), before another write begins (a write the freeze caught between its
check and the socket still goes out as the process resumes: one request over HTTP/1.1,
over HTTP/2 on libcurl the streams whose bodies it had taken and not yet written, one as
a rule (its turn writes many, but takes each body through a check: ``curl_h2``), the
frames of one write on the ``h2`` fallback; in flight at the freeze); its supervisor
(``campaign-trigger up``, systemd, Kubernetes) starts it again, and its runs are taken
over as a killed worker's are: at most the messages in flight when it froze go twice.
An idle process (no run) that was frozen goes on. The check costs a send ~0.15 µs.

A process need not be frozen to lose its runs: one cut off from Prefect (a network
partition, the server down or overloaded) while it can still reach the database and the
providers goes on sending as its heartbeats stop reaching the server, which then marks
its runs dead and hands them to another worker: both would send the same messages.
Hence the **lease**: the worker sends its runs' heartbeats itself
(``deployments/heartbeats.py``), and each one the server answered renews the process's
lease from the moment it was sent (so does a claim: a run's Pending state is a sign of
life too). Once the lease is older than :func:`lease_seconds` (half the time after which
a run without a heartbeat is marked dead) in a process holding runs, the watch's thread
sets :data:`FENCED` (within a tick): the senders start no new message, and the answers
to those in flight are still recorded; :func:`fence_grace_seconds` later the process
exits, like a frozen one, found out by a write's :func:`check` or by the thread,
whichever comes first. What is left of ``dead_after`` is the margin for the two clocks
(the server dates a heartbeat by the worker's). So a process cut off from Prefect stops
with nothing sent and not recorded, unless a provider's answer takes longer than the
grace. A freeze is one way of losing the lease; the freeze threshold only finds it out
sooner, and a process that was frozen has no answers to wait for.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)

EXIT_CODE = 75  # EX_TEMPFAIL: start it again
TICK_SECONDS = 0.5
FENCED = False
"""True once the process's lease lapsed: no new message is to be sent (``sending.py``)."""


def _boot_clock() -> float:
    """Seconds since boot, suspended time included (a paused or suspended machine's
    freeze counts: Linux's monotonic clock stops while the system is suspended)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


CLOCK: Callable[[], float] = _boot_clock if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic


def threshold_seconds(*, dead_after: float, heartbeat_seconds: float) -> float:
    """Half the shortest freeze that can get a run marked dead: its last heartbeat may
    be up to ``heartbeat_seconds`` old when the process freezes."""
    return max(dead_after - heartbeat_seconds, 2 * TICK_SECONDS) / 2


def lease_seconds(dead_after: float) -> float:
    """How long after its runs' last heartbeat the server answered a worker process
    may still send: half of ``dead_after``, the time without one after which a run is
    marked dead."""
    return dead_after / 2


def fence_grace_seconds(dead_after: float) -> float:
    """How long a process whose lease lapsed waits for the answers to the messages it
    has in flight (sending no other) before it exits: an eighth of ``dead_after``."""
    return dead_after / 8


def run_heartbeat_seconds(dead_after: float) -> float:
    """Seconds between a worker's heartbeats for its runs: four to a lease, so that
    three lost in a row do not end it."""
    return lease_seconds(dead_after) / 4


def worker_threshold_seconds(dead_after: float) -> float:
    """The freeze a worker process exits after, its runs sending heartbeats every
    :func:`run_heartbeat_seconds` and marked dead after ``dead_after`` without one."""
    return threshold_seconds(
        dead_after=dead_after, heartbeat_seconds=run_heartbeat_seconds(dead_after)
    )


def _exit_saying(why: str) -> None:
    os.write(2, f"campaign-trigger: {why}: exiting before it sends again\n".encode())
    os._exit(EXIT_CODE)


def _exit(frozen: float) -> None:
    _exit_saying(
        f"this process was frozen for {frozen:.1f} s, long enough for its runs to be "
        "taken over by another worker"
    )


def _exit_lapsed(silent: float) -> None:
    _exit_saying(
        f"no heartbeat of this process's runs has reached Prefect for {silent:.1f} s, "
        "long enough for them to be taken over by another worker"
    )


class FreezeWatch:
    """Finds out a freeze of ``threshold`` seconds or more, and with a ``lease``, a
    lease not renewed (:meth:`renew`) for longer than that; calls ``on_frozen`` (the
    seconds frozen) or ``on_lapsed`` (the seconds since the lease's start) from the
    thread if ``busy()`` (the process holds runs), or from :meth:`check` (a send)."""

    def __init__(
        self,
        threshold: float,
        *,
        busy: Callable[[], bool],
        lease: float | None = None,
        grace: float = 0.0,
        on_frozen: Callable[[float], None] = _exit,
        on_lapsed: Callable[[float], None] = _exit_lapsed,
        clock: Callable[[], float] = CLOCK,
    ) -> None:
        self.threshold = threshold
        self._stale = threshold + TICK_SECONDS  # the last tick's age after such a freeze
        self.lease = lease
        self.grace = grace
        self._busy = busy
        self._on_frozen = on_frozen
        self._on_lapsed = on_lapsed
        self._clock = clock
        self._tick = self._renewed = clock()
        self._fenced_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="freeze-watch", daemon=True)

    def renew(self, sent_at: float) -> None:
        """The server answered a sign of the runs' life sent at ``sent_at`` (this watch's
        clock): the lease runs from then."""
        self._renewed = max(self._renewed, sent_at)

    def _lapsed(self, now: float, *, grace: float = 0.0) -> float | None:
        """Seconds since the lease's start if it lapsed ``grace`` seconds ago or more
        with runs held, else None."""
        silent = now - self._renewed
        if self.lease is not None and silent > self.lease + grace and self._busy():
            return silent
        return None

    def check(self) -> None:
        """Before a write: the process must not have been frozen since the last tick, nor
        have held runs whose heartbeats went unanswered for longer than its lease and
        grace."""
        now = self._clock()
        age = now - self._tick
        if age >= self._stale:
            self._on_frozen(age - TICK_SECONDS)
        silent = self._lapsed(now, grace=self.grace)
        if silent is not None:
            self._on_lapsed(silent)

    def _watch(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            now = self._clock()
            frozen = now - self._tick - TICK_SECONDS
            if frozen >= self.threshold:
                if self._busy():
                    self._on_frozen(frozen)
                    return
                logger.warning("this process was frozen for %.1f s (no run held)", frozen)
            self._fence(now)
            if self._fenced_at is not None and now - self._fenced_at >= self.grace:
                self._on_lapsed(now - self._renewed)  # even if its runs ended meanwhile
                return
            self._tick = now

    def _fence(self, now: float) -> None:
        global FENCED
        if self._fenced_at is None and (silent := self._lapsed(now)) is not None:
            FENCED, self._fenced_at = True, now
            logger.error(
                "no heartbeat of this process's runs has reached Prefect for %.1f s: no new "
                "message is sent; exiting in %.1f s, the answers to those in flight recorded",
                silent,
                self.grace,
            )

    @contextlib.contextmanager
    def watching(self) -> Iterator[FreezeWatch]:
        """The watch runs, and :func:`check` asks it, while the block runs."""
        self._thread.start()
        _watches.append(self)
        try:
            yield self
        finally:
            _watches.remove(self)
            self._stop.set()
            self._thread.join()


# The watches running in this process: one per worker, more only where several workers
# share a process (tests). A freeze stops the whole process, so any one of them sees it;
# the latest started answers :func:`check`, whichever of the others ends first.
_watches: list[FreezeWatch] = []


def check() -> None:
    """Before a transport writes: exits the process if it was frozen too long, or its
    lease lapsed (nothing outside a worker process, which alone runs a watch)."""
    if _watches:
        _watches[-1].check()


def renew(sent_at: float) -> None:
    """A sign of the process's runs' life sent at ``sent_at`` (:data:`CLOCK`) was
    answered: every watch's lease runs from then."""
    for watch in _watches:
        watch.renew(sent_at)
