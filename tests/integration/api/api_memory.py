"""Resident memory of a server process, sampled in a thread while a test calls it.
Imported by name (``from api_memory import PeakRss``)."""

from __future__ import annotations

import threading
import time

import psutil


class PeakRss:
    """Samples a process's resident memory in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int, interval: float = 0.02) -> None:
        self.process = psutil.Process(pid)
        self.interval = interval
        self.start = self.rss()
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        """The process's and its children's resident memory now, in bytes."""
        return sum(p.memory_info().rss for p in [self.process, *self.process.children(True)])

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            self.samples += 1
            time.sleep(self.interval)

    def __enter__(self) -> PeakRss:
        self.start = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
