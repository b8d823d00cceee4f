"""An operator's device import (``admin import-devices``): a million rows in seconds.

The file is parsed once by pyarrow (every value text) and checked column-wise with the
rules of :func:`campaign_trigger.services.admin.parse_device_rows`: the first bad row
(by its record number, the header being line 1) refuses the whole file with the same
reason. Then one statement set per database, inside the caller's transaction:

* PostgreSQL: ``COPY`` into a temporary table, then one ``UPDATE … FROM`` for the
  devices already known and one ``INSERT … SELECT`` of the others (``ON CONFLICT``
  still: a device registering during the import must not fail it);
* SQLite (and any other): the same upsert, ``executemany`` in batches.

The upsert is :func:`campaign_trigger.services.devices.refresh`'s rule in SQL: a new
push token clears ``unregistered_at``; ``uninstalled_at`` is cleared; ``updated_at``
is now; the device secret is kept. A push token belongs to one device of an app: a file
giving one token to two devices is refused, and the file's tokens are taken from the
app's other devices first (those the file leaves out lose them and count as uninstalled,
as :func:`~campaign_trigger.services.devices.take_token` does for a registration; those
it names get what it gives them). A
device the file repeats exactly (same user, token and flags, not uninstalled) is left
as it is, ``updated_at`` included: the nightly re-import of a whole base rewrites only
what changed (PostgreSQL, quiet: 1 M unchanged
devices in 4.9 s). On PostgreSQL the device table keeps half of each page free
(migration 0007), so a changed row's new version stays on its page and no index is
touched when no indexed column changed (new flags: a HOT update; a new token is
indexed since migration 0008, so not one).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
from sqlmodel import Session

from campaign_trigger.errors import AdminError
from campaign_trigger.store.models import Device

DEVICE_COLUMNS: Final = ("device_id", "user_id", "push_token", "opted_in", "logged_in")
TRUE_VALUES: Final = ("true", "1", "yes", "y", "t")
FALSE_VALUES: Final = ("false", "0", "no", "n", "f")
BATCH_ROWS: Final = 50_000

Progress = Callable[[int, int], None]
"""Called with (rows written, rows in the file) as the import advances."""

# A known device is written only when the file changes it (or it was uninstalled).
CHANGED: Final = """\
device.user_id IS DISTINCT FROM {new}.user_id
    OR device.push_token IS DISTINCT FROM {new}.push_token
    OR device.opted_in <> {new}.opted_in
    OR device.logged_in <> {new}.logged_in
    OR device.uninstalled_at IS NOT NULL"""
SQLITE_UPSERT: Final = """
INSERT INTO device (app_id, device_id, user_id, push_token, opted_in, logged_in, updated_at)
VALUES (?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (app_id, device_id) DO UPDATE SET
    unregistered_at = CASE WHEN device.push_token IS NOT DISTINCT FROM excluded.push_token
                      THEN device.unregistered_at ELSE NULL END,
    push_token = excluded.push_token,
    uninstalled_at = NULL,
    updated_at = excluded.updated_at,
    user_id = excluded.user_id,
    opted_in = excluded.opted_in,
    logged_in = excluded.logged_in
WHERE {changed}
""".format(changed=CHANGED.format(new="excluded"))
# A token belongs to one device of an app: the file's takes it from the app's others
# (:func:`campaign_trigger.services.devices.take_token`), before the upsert writes it.
SQLITE_NEW_OWNER: Final = """
UPDATE device SET push_token = NULL, uninstalled_at = COALESCE(uninstalled_at, ?1),
    updated_at = ?1
WHERE push_token = ?2 AND app_id = ?3 AND device_id <> ?4
"""
# Only devices the file leaves out: the update below rewrites every other one, its token
# included (1 M tokens each moved to another device of the file were written twice, the
# import 35.4 s against 20.3 s, docs/benchmarks.md).
POSTGRES_NEW_OWNER: Final = """
UPDATE device SET push_token = NULL, uninstalled_at = COALESCE(device.uninstalled_at, %(now)s),
    updated_at = %(now)s
FROM device_import AS i
WHERE device.push_token = i.push_token AND device.app_id = %(app_id)s
    AND NOT EXISTS (SELECT 1 FROM device_import AS o WHERE o.device_id = device.device_id)
"""
POSTGRES_UPDATE: Final = """
UPDATE device SET
    unregistered_at = CASE WHEN device.push_token IS NOT DISTINCT FROM i.push_token
                      THEN device.unregistered_at ELSE NULL END,
    push_token = i.push_token,
    uninstalled_at = NULL,
    updated_at = %(now)s,
    user_id = i.user_id,
    opted_in = i.opted_in,
    logged_in = i.logged_in
FROM device_import AS i
WHERE device.app_id = %(app_id)s AND device.device_id = i.device_id AND ({changed})
""".format(changed=CHANGED.format(new="i"))
# then the rows the update did not find (ON CONFLICT: a device registered meanwhile)
POSTGRES_INSERT: Final = """
INSERT INTO device (app_id, device_id, user_id, push_token, opted_in, logged_in, updated_at)
SELECT %(app_id)s::varchar, i.device_id, i.user_id, i.push_token, i.opted_in, i.logged_in,
       %(now)s::timestamptz
FROM device_import AS i
WHERE NOT EXISTS (
    SELECT 1 FROM device AS d WHERE d.app_id = %(app_id)s AND d.device_id = i.device_id
)
ON CONFLICT (app_id, device_id) DO UPDATE SET
    unregistered_at = CASE WHEN device.push_token IS NOT DISTINCT FROM excluded.push_token
                      THEN device.unregistered_at ELSE NULL END,
    push_token = excluded.push_token,
    uninstalled_at = NULL,
    updated_at = excluded.updated_at,
    user_id = excluded.user_id,
    opted_in = excluded.opted_in,
    logged_in = excluded.logged_in
WHERE {changed}
""".format(changed=CHANGED.format(new="excluded"))  # noqa: S608 (constants only)


def read_device_file(path: Path) -> pa.Table:
    """The checked devices of ``path``: columns of DEVICE_COLUMNS, ids and tokens
    trimmed (empty → null), the flags booleans. Raises AdminError for the first bad row."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            header = next(csv.reader(handle), [])
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise AdminError(f"Cannot read {path}: {exc}") from None
    missing = [name for name in DEVICE_COLUMNS if name not in header]
    if missing:
        raise AdminError(f"Device file lacks column(s): {', '.join(missing)}")
    bad_rows: list[int] = []

    def invalid(row: Any) -> str:
        bad_rows.append(row.number)
        return "skip"

    try:
        table = pacsv.read_csv(
            path,
            read_options=pacsv.ReadOptions(use_threads=False, block_size=16 << 20),
            parse_options=pacsv.ParseOptions(invalid_row_handler=invalid),
            convert_options=pacsv.ConvertOptions(
                column_types=dict.fromkeys(DEVICE_COLUMNS, pa.string()),
                include_columns=list(DEVICE_COLUMNS),
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
            ),
        )
    except (OSError, pa.ArrowInvalid) as exc:
        raise AdminError(f"Cannot read {path}: {exc}") from None
    columns = {name: table.column(name).combine_chunks() for name in DEVICE_COLUMNS}
    # Which row is bad first: rows skipped by the parser (wrong number of fields) are
    # not in the table, so a row index is its record only below the first such row.
    first_skipped = min(bad_rows, default=None)
    limit = len(table) if first_skipped is None else min(len(table), first_skipped - 2)
    trimmed = {
        name: pc.utf8_trim_whitespace(columns[name])
        for name in ("device_id", "user_id", "push_token")
    }
    lowered = {
        name: pc.ascii_lower(pc.utf8_trim_whitespace(columns[name]))
        for name in ("opted_in", "logged_in")
    }

    failures: list[tuple[int, int, str]] = []  # (row, order of the check, reason)
    empty = _first(pc.equal(pc.utf8_length(trimmed["device_id"]), 0))
    if empty is not None:
        failures.append((empty, 0, "device_id is empty"))
    duplicate = _first_duplicate(trimmed["device_id"])
    if duplicate is not None:
        repeated = trimmed["device_id"][duplicate].as_py()
        failures.append((duplicate, 1, f"device_id {repeated!r} appears twice"))
    token_twice = _first_duplicate(pc.drop_null(nullable_text(trimmed["push_token"])))
    if token_twice is not None:
        row, first = _rows_of_token(trimmed["push_token"], token_twice)
        failures.append((row, 5, f"push_token of line {first + 2} appears twice"))
    for order, name in enumerate(("opted_in", "logged_in"), start=3):
        known = pc.is_in(lowered[name], value_set=pa.array(TRUE_VALUES + FALSE_VALUES))
        unknown = _first(pc.invert(known))
        if unknown is not None:
            value = columns[name][unknown].as_py()
            failures.append((unknown, order, f"{name} must be true or false, not {value!r}"))
    failures = [failure for failure in failures if failure[0] < limit]
    if failures:
        row, _, reason = min(failures)
        raise AdminError(f"Line {row + 2}: {reason}")
    if first_skipped is not None:
        raise AdminError(f"Line {first_skipped}: wrong number of fields")

    return pa.table(
        {
            "device_id": trimmed["device_id"],
            "user_id": nullable_text(trimmed["user_id"]),
            "push_token": nullable_text(trimmed["push_token"]),
            "opted_in": pc.is_in(lowered["opted_in"], value_set=pa.array(TRUE_VALUES)),
            "logged_in": pc.is_in(lowered["logged_in"], value_set=pa.array(TRUE_VALUES)),
        }
    )


def nullable_text(values: pa.Array) -> pa.Array:
    """``values`` with empty texts as nulls."""
    return pc.if_else(pc.equal(pc.utf8_length(values), 0), None, values)


def _rows_of_token(tokens: pa.Array, nth_present: int) -> tuple[int, int]:
    """The row of the ``nth_present`` non-empty token (one seen before), and the row of
    its first occurrence."""
    present = pc.indices_nonzero(pc.greater(pc.utf8_length(tokens), 0))
    row = int(present[nth_present].as_py())
    first = _first(pc.equal(tokens, tokens[row]))
    assert first is not None
    return row, first


def _first(mask: pa.Array) -> int | None:
    """The index of the first true value of ``mask``, or None."""
    index = pc.index(mask, True).as_py()
    return None if index < 0 else int(index)


def _first_duplicate(values: pa.Array) -> int | None:
    """The index of the first value seen before (the second occurrence), or None."""
    if len(pc.unique(values)) == len(values):
        return None
    seen: set[str] = set()
    for index, value in enumerate(values.to_pylist()):
        if value in seen:
            return index
        seen.add(value)
    return None  # pragma: no cover - unique() said there is one


def import_device_table(
    *, session: Session, app_id: str, devices: pa.Table, progress: Progress | None = None
) -> int:
    """Insert or update ``devices`` (from :func:`read_device_file`) for the app, in the
    session's transaction; returns their number."""
    connection = session.connection()
    total = len(devices)
    # updated_at as the ORM would bind it (SQLite: its text form), converted once
    updated_type = Device.__table__.c.updated_at.type  # type: ignore[attr-defined]
    dialect = connection.dialect
    bind = updated_type.dialect_impl(dialect).bind_processor(dialect)
    now = bind(datetime.now(UTC)) if bind else datetime.now(UTC)
    if connection.dialect.name == "postgresql":
        _copy_postgres(connection, app_id, devices, now, progress)
    else:
        for start in range(0, total, BATCH_ROWS):
            part = devices.slice(start, BATCH_ROWS).to_pydict()
            rows = [
                (app_id, *values, now)
                for values in zip(
                    part["device_id"],
                    part["user_id"],
                    part["push_token"],
                    part["opted_in"],
                    part["logged_in"],
                    strict=True,
                )
            ]
            taken = [
                (now, token, app_id, device_id) for _, device_id, _, token, *_ in rows if token
            ]
            if taken:
                connection.exec_driver_sql(SQLITE_NEW_OWNER, taken)
            connection.exec_driver_sql(SQLITE_UPSERT, rows)
            if progress is not None:
                progress(start + len(rows), total)
    session.expire_all()  # ORM objects loaded before the import are stale
    return total


def _copy_postgres(
    connection: Any, app_id: str, devices: pa.Table, now: object, progress: Progress | None
) -> None:
    raw = connection.connection.driver_connection  # psycopg 3
    total = len(devices)
    with raw.cursor() as cursor:
        # this transaction only: the joins hash a million devices (~150 MB; a hash may
        # take twice work_mem) in memory rather than in batches through temporary files
        cursor.execute("SET LOCAL work_mem = '128MB'")
        cursor.execute(
            "CREATE TEMP TABLE device_import (device_id text, user_id text, push_token text,"
            " opted_in boolean, logged_in boolean) ON COMMIT DROP"
        )
        with cursor.copy("COPY device_import FROM STDIN (FORMAT csv)") as copy:
            for start in range(0, total, BATCH_ROWS):
                part = devices.slice(start, BATCH_ROWS)
                buffer = io.BytesIO()
                options = pacsv.WriteOptions(include_header=False, quoting_style="needed")
                pacsv.write_csv(part, buffer, write_options=options)
                copy.write(buffer.getvalue())
                if progress is not None:
                    progress(start + len(part), total)
        cursor.execute("ANALYZE device_import")  # a temporary table has no statistics
        cursor.execute(POSTGRES_NEW_OWNER, {"app_id": app_id, "now": now})
        cursor.execute(POSTGRES_UPDATE, {"app_id": app_id, "now": now})
        cursor.execute(POSTGRES_INSERT, {"app_id": app_id, "now": now})
        cursor.execute("DROP TABLE device_import")
