"""A real process frozen with SIGSTOP, its freeze watch's threshold passed, exits at
SIGCONT without letting one more send through (``delivery/freeze.py``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

from campaign_trigger.delivery import freeze

CHILD = textwrap.dedent(
    """
    import sys, time
    from campaign_trigger.delivery import freeze
    with freeze.FreezeWatch(1.0, busy=lambda: True).watching():
        print("ready", flush=True)
        while True:
            moment = time.monotonic()
            freeze.check()
            print(moment, flush=True)  # a send, let through at that moment
            time.sleep(0.01)
    """
)


def test_a_process_frozen_by_sigstop_exits_at_sigcont_without_another_send() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == b"ready\n"
        time.sleep(0.3)
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(2.5)  # frozen for 2.5 s, the threshold 1 s
        resumed = time.monotonic()  # the same clock as the child's
        os.kill(child.pid, signal.SIGCONT)
        assert child.wait(timeout=10) == freeze.EXIT_CODE
        sends = [float(line) for line in child.stdout.read().split()]
    finally:
        child.kill()
    assert len(sends) > 10  # it was sending
    # Not one send let through after the freeze (one let through just before it may be
    # printed after it: a send in flight).
    assert max(sends) < resumed
    assert child.stderr is not None
    assert b"frozen for 2." in child.stderr.read()
