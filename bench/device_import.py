"""``admin import-devices`` of N devices on SQLite and PostgreSQL, vs a bare bulk load.

For each database (a fresh SQLite file; a throwaway database on the local PostgreSQL,
skipped with a notice when none answers): a CSV of N devices (64-character tokens) is
imported four times through the service the command calls — into an empty app
(inserts), then again as it is (every device known and unchanged: nothing to write), then
with every push token new (every row rewritten), then with every token moved to the next
device of the file (each taken from the device that held it) — and the same rows are
loaded bare, as a reference measured in the same run: ``sqlite3.executemany`` of a plain
``INSERT`` of prebuilt tuples, or ``COPY`` of the prebuilt CSV straight into the device
table. Prints wall and CPU seconds, the ratio to the bare load, and the verdict against
issue 14's target (≤ 15 s for 1 M devices on each database).

Usage: ``.venv/bin/python bench/device_import.py [-n 1000000] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import psycopg
from sqlmodel import Session

from campaign_trigger.services.admin import import_devices
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.migrate import upgrade
from campaign_trigger.store.models import App, Organisation, Platform
from harness import POSTGRES, postgres_database, result

TARGET_SECONDS_PER_MILLION = 15.0
BARE = {"SQLite": "executemany", "PostgreSQL": "COPY"}
HEADER = "device_id,user_id,push_token,opted_in,logged_in\n"


class Timing(NamedTuple):
    wall: float
    cpu: float  # this process's CPU seconds (the database server's excluded)


def timed(action: Callable[[], object]) -> Timing:
    started, cpu = time.perf_counter(), time.process_time()
    action()
    return Timing(time.perf_counter() - started, time.process_time() - cpu)


def write_file(path: Path, n: int, *, token_shift: int = 0) -> None:
    """N devices; ``token_shift`` gives every device another push token."""
    with path.open("w") as out:
        out.write(HEADER)
        for start in range(0, n, 100_000):
            out.write(
                "".join(
                    f"dev-{i:09d},user-{i:09d},{i + token_shift:064x},true,"
                    f"{'true' if i % 3 else 'false'}\n"
                    for i in range(start, min(n, start + 100_000))
                )
            )


def new_app(url: str) -> str:
    with Session(engine_for(url)) as session:
        org = Organisation(name=f"bench-{uuid.uuid4().hex[:8]}")
        session.add(org)
        session.flush()
        assert org.id is not None
        app = App(
            app_id=f"bench-{org.id}", org_id=org.id, platform=Platform.ios, sdk_key=uuid.uuid4().hex
        )
        session.add(app)
        session.commit()
        return app.app_id


def through_service(url: str, app_id: str, path: Path) -> Timing:
    def run() -> None:
        with Session(engine_for(url)) as session:
            import_devices(session=session, app_id=app_id, path=path)
            session.commit()

    return timed(run)


def bare_sqlite(database: Path, app_id: str, path: Path) -> Timing:
    """Plain INSERT of prebuilt tuples into the (empty for this app) device table."""
    lines = path.read_text().splitlines()[1:]
    now = "2026-11-22 00:00:00.000000"
    rows = []
    for line in lines:
        device, user, token, opted, logged = line.split(",")
        rows.append((app_id, device, user, token, opted == "true", logged == "true", now))
    connection = sqlite3.connect(database)
    connection.execute("PRAGMA synchronous=NORMAL")

    def run() -> None:
        with connection:
            connection.executemany(
                "INSERT INTO device (app_id, device_id, user_id, push_token, opted_in,"
                " logged_in, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
                rows,
            )

    try:
        return timed(run)
    finally:
        connection.close()


def bare_copy(url: str, app_id: str, path: Path) -> Timing:
    """COPY of the file, as it is, straight into the device table."""
    data = path.read_bytes().split(b"\n", 1)[1]

    def run() -> None:
        with psycopg.connect(url) as connection, connection.cursor() as cursor:
            cursor.execute(
                "CREATE TEMP TABLE bare (device_id text, user_id text, push_token text,"
                " opted_in boolean, logged_in boolean)"
            )
            with cursor.copy("COPY bare FROM STDIN (FORMAT csv)") as copy:
                for start in range(0, len(data), 8 << 20):
                    copy.write(data[start : start + (8 << 20)])
            cursor.execute(
                "INSERT INTO device (app_id, device_id, user_id, push_token, opted_in,"
                " logged_in, updated_at) SELECT %s, device_id, user_id, push_token, opted_in,"
                " logged_in, now() FROM bare",
                (app_id,),
            )

    return timed(run)


@contextmanager
def databases(work: Path) -> Iterator[list[tuple[str, str]]]:
    found = [("SQLite", f"sqlite:///{work / 'bench.db'}")]
    try:
        subprocess.run(["psql", POSTGRES, "-qc", "select 1"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError):
        print(f"!!! no PostgreSQL at {POSTGRES}: its rows are skipped !!!")
        yield found
        return
    with postgres_database() as name:
        yield [*found, ("PostgreSQL", f"{POSTGRES}/{name}")]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("-n", type=int, default=1_000_000, help="devices in the file")
    parser.add_argument("--quick", action="store_true", help="-n 200000 (no verdict)")
    args = parser.parse_args()
    n = 200_000 if args.quick else args.n
    target = TARGET_SECONDS_PER_MILLION * n / 1_000_000
    work = Path(tempfile.mkdtemp(prefix="ct-bench-devices-"))
    path, changed, moved = work / "devices.csv", work / "changed.csv", work / "moved.csv"
    write_file(path, n)
    write_file(changed, n, token_shift=n)
    write_file(moved, n, token_shift=n + 1)  # device i gets the token device i + 1 had
    load = os.getloadavg()[0]
    print(
        f"import-devices: {n:,} devices, {path.stat().st_size / 1e6:.0f} MB; "
        f"{os.cpu_count()} CPUs, load average {load:.1f}",
        flush=True,
    )
    with databases(work) as found:
        for name, url in found:
            upgrade(url)
            inserted = through_service(url, new_app(url), path)
            app_id = new_app(url)
            through_service(url, app_id, path)
            unchanged = through_service(url, app_id, path)
            updated = through_service(url, app_id, changed)
            shifted = through_service(url, app_id, moved)
            if name == "SQLite":
                bare = bare_sqlite(work / "bench.db", new_app(url), path)
            else:
                bare = bare_copy(url, new_app(url), path)
            engine_for(url).dispose()
            phases = (
                ("insert", inserted),
                ("unchanged", unchanged),
                ("update", updated),
                ("moved", shifted),
            )
            for label, figure in phases:
                print(
                    f"  {name:10s} {label:9s}: {figure.wall:6.2f} s wall, {figure.cpu:6.2f} s CPU"
                    f" | bare load {bare.wall:6.2f} s wall | ratio {figure.wall / bare.wall:.2f}",
                    flush=True,
                )
            labels = (
                "new devices",
                "re-import, unchanged",
                "re-import, every token new",
                "re-import, every token moved to another device",
            )
            figures = (inserted, unchanged, updated, shifted)
            for label, figure in zip(labels, figures, strict=True):
                # fixed costs (imports, pyarrow's first calls) weigh on small files
                result(
                    "device_import",
                    f"{name}, {n:,} devices, {label}",
                    figure=f"{figure.wall:.2f} s",
                    reference=f"{bare.wall:.2f} s (bare {BARE[name]} of the same rows)",
                    ratio=figure.wall / bare.wall,
                    target=f"<= {TARGET_SECONDS_PER_MILLION:.0f} s for 1 M devices",
                    met=figure.wall <= target if n >= 1_000_000 else None,
                    why="" if n >= 1_000_000 else "quick size: judged at 1 M devices",
                )
    print(f"(load average {load:.1f} before, {os.getloadavg()[0]:.1f} after)")
    for leftover in work.iterdir():
        leftover.unlink()
    work.rmdir()


if __name__ == "__main__":
    sys.exit(main())
