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
RUN_HEARTBEAT_SECONDS = 30  # a worker's runs' heartbeats (Prefect's minimum)


def _boot_clock() -> float:
    """Seconds since boot, suspended time included (a paused or suspended machine's
    freeze counts: Linux's monotonic clock stops while the system is suspended)."""
    return time.clock_gettime(time.CLOCK_BOOTTIME)


CLOCK: Callable[[], float] = _boot_clock if hasattr(time, "CLOCK_BOOTTIME") else time.monotonic


def threshold_seconds(*, dead_after: float, heartbeat_seconds: float) -> float:
    """Half the shortest freeze that can get a run marked dead: its last heartbeat may
    be up to ``heartbeat_seconds`` old when the process freezes."""
    return max(dead_after - heartbeat_seconds, 2 * TICK_SECONDS) / 2


def worker_threshold_seconds(dead_after: float) -> float:
    """The freeze a worker process exits after, its runs sending heartbeats every
    :data:`RUN_HEARTBEAT_SECONDS` and marked dead after ``dead_after`` without one."""
    return threshold_seconds(dead_after=dead_after, heartbeat_seconds=RUN_HEARTBEAT_SECONDS)


def _exit(frozen: float) -> None:
    os.write(
        2,
        (
            f"campaign-trigger: this process was frozen for {frozen:.1f} s, long enough for "
            "its runs to be taken over by another worker: exiting before it sends again\n"
        ).encode(),
    )
    os._exit(EXIT_CODE)


class FreezeWatch:
    """Finds out a freeze of ``threshold`` seconds or more; calls ``on_frozen`` (the
    seconds frozen) from the thread if ``busy()`` (the process holds runs), or from
    :meth:`check` (a send)."""

    def __init__(
        self,
        threshold: float,
        *,
        busy: Callable[[], bool],
        on_frozen: Callable[[float], None] = _exit,
        clock: Callable[[], float] = CLOCK,
    ) -> None:
        self.threshold = threshold
        self._stale = threshold + TICK_SECONDS  # the last tick's age after such a freeze
        self._busy = busy
        self._on_frozen = on_frozen
        self._clock = clock
        self._tick = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="freeze-watch", daemon=True)

    def check(self) -> None:
        """Before a write: the process must not have been frozen since the last tick."""
        age = self._clock() - self._tick
        if age >= self._stale:
            self._on_frozen(age - TICK_SECONDS)

    def _watch(self) -> None:
        while not self._stop.wait(TICK_SECONDS):
            now = self._clock()
            frozen = now - self._tick - TICK_SECONDS
            if frozen >= self.threshold:
                if self._busy():
                    self._on_frozen(frozen)
                    return
                logger.warning("this process was frozen for %.1f s (no run held)", frozen)
            self._tick = now

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
    """Before a transport writes: exits the process if it was frozen too long (nothing
    outside a worker process, which alone runs a watch)."""
    if _watches:
        _watches[-1].check()
