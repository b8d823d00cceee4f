"""Progress bars of long work on a terminal: the device import of the CLI, a CSV upload
through the Python client. Drawn on stderr when it is a terminal (what a program prints
on stdout stays clean), nothing otherwise."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, Literal

Report = Callable[[int, int], None]  # (done, total)


@contextmanager
def progress_bar(
    description: str, *, unit: Literal["rows", "bytes"] = "rows"
) -> Iterator[Report | None]:
    """A progress callback drawing a bar on stderr when it is a terminal, else None."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TransferSpeedColumn,
    )

    counts = (
        (DownloadColumn(), TransferSpeedColumn()) if unit == "bytes" else (MofNCompleteColumn(),)
    )
    columns = (TextColumn(description), BarColumn(), *counts, TimeElapsedColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(description, total=None)  # no total until the caller knows it
        yield lambda done, total: bar.update(task, completed=done, total=total)


class ReadProgress:
    """A binary file whose reads report how far they got (for an HTTP upload of it)."""

    def __init__(self, raw: IO[bytes], *, total: int, report: Report) -> None:
        self._raw, self._total, self._report = raw, total, report

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self._report(self._raw.tell(), self._total)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def fileno(self) -> int:
        return self._raw.fileno()
