"""Who a request reaches: its messages, in a stable order, and each user's devices.

Messages are read once per process into a pyarrow table (``user_id`` plus one
string column per template variable), from ``RequestMessage`` rows (JSON requests,
ordered by ``seq``) or from the stored CSV file (file order). Chunk ``k`` is rows
``[k * chunk_size, (k + 1) * chunk_size)``: the same on every re-run.

For a chunk, :func:`resolve_targets` finds each user's devices in each app of the
campaign and decides the pre-send outcome of every device: one report row per
device, in its app's report. A user with no device in any app of the campaign gets
one ``No device for user`` row in every app's report (so each file accounts for
them); a user with devices in some apps only is not listed in the other apps'.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

import pyarrow as pa
import pyarrow.csv as pacsv
from sqlalchemy import select
from sqlmodel import col

from campaign_trigger.config import Settings
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import get_storage, upload_key
from campaign_trigger.store.models import (
    App,
    CampaignApp,
    Channel,
    Device,
    MessageSource,
    Platform,
    Request,
    RequestMessage,
)

NO_DEVICE: Final = "No device for user"
NOT_LOGGED_IN: Final = "Last user not logged in"
OPT_OUT: Final = "Opt out"
APP_UNINSTALLED: Final = "App uninstalled"
USER_COLUMN: Final = "user_id"
_CSV_USER_COLUMN: Final = "User"
_SQL_BATCH: Final = 2000
_CACHE_SIZE: Final = 4

_cache: OrderedDict[str, pa.Table] = OrderedDict()


@dataclass(frozen=True, slots=True)
class AppTarget:
    """An app of the campaign."""

    app_id: str
    platform: Platform


@dataclass(slots=True)
class Target:
    """One report row to be: a message for one device (or for no device)."""

    row: int  # the message's index in the chunk
    app_id: str
    user_id: str
    device_id: str
    token: str
    error_message: str  # "" = to send; else a pre-send outcome


def campaign_apps(campaign_id: str) -> list[AppTarget]:
    """The campaign's apps, ordered by app id."""
    with session_scope() as session:
        rows = session.execute(
            select(col(App.app_id), col(App.platform))
            .join(CampaignApp, col(CampaignApp.app_id) == col(App.app_id))
            .where(col(CampaignApp.campaign_id) == campaign_id)
            .order_by(col(App.app_id))
        ).all()
    return [AppTarget(app_id=app_id, platform=Platform(platform)) for app_id, platform in rows]


def _json_messages(request_id: str) -> pa.Table:
    with session_scope() as session:
        rows = session.execute(
            select(col(RequestMessage.user_id), col(RequestMessage.template_variables))
            .where(col(RequestMessage.request_id) == request_id)
            .order_by(col(RequestMessage.seq))
        ).all()
    users = [user for user, _ in rows]
    names: list[str] = []
    for _, variables in rows:
        for name in variables or {}:
            if name not in names:
                names.append(name)
    columns: dict[str, list[Any]] = {USER_COLUMN: users}
    for name in names:
        columns[name] = [
            None if (v := (variables or {}).get(name)) is None else str(v) for _, variables in rows
        ]
    return pa.table({k: pa.array(v, pa.string()) for k, v in columns.items()})


def _csv_messages(settings: Settings, key: str) -> pa.Table:
    storage = get_storage(settings)
    convert = pacsv.ConvertOptions(strings_can_be_null=False, quoted_strings_can_be_null=False)
    local = storage.local_path(key)
    read_options = pacsv.ReadOptions(block_size=16 << 20)
    if local is not None:
        table = pacsv.read_csv(local, read_options=read_options, convert_options=convert)
    else:
        with storage.open(key, "rb") as handle:
            table = pacsv.read_csv(handle, read_options=read_options, convert_options=convert)
    table = table.cast(pa.schema([pa.field(name, pa.string()) for name in table.column_names]))
    names = [USER_COLUMN if name == _CSV_USER_COLUMN else name for name in table.column_names]
    return table.rename_columns(names)


def load_messages(settings: Settings, request: Request) -> pa.Table:
    """The request's messages as a table (cached per process: re-runs re-read)."""
    cached = _cache.get(request.id)
    if cached is not None:
        _cache.move_to_end(request.id)
        return cached
    if request.source == MessageSource.csv:
        table = _csv_messages(settings, request.messages_path or upload_key(request.id))
    else:
        table = _json_messages(request.id)
    _cache[request.id] = table
    while len(_cache) > _CACHE_SIZE:
        _cache.popitem(last=False)
    return table


def forget_messages(request_id: str) -> None:
    _cache.pop(request_id, None)


def chunk_count(message_count: int, chunk_size: int) -> int:
    return (message_count + chunk_size - 1) // chunk_size


def _device_rows(app_ids: list[str], users: list[str]) -> list[Any]:
    rows: list[Any] = []
    with session_scope() as session:
        for start in range(0, len(users), _SQL_BATCH):
            batch = users[start : start + _SQL_BATCH]
            rows.extend(
                session.execute(
                    select(
                        col(Device.app_id),
                        col(Device.user_id),
                        col(Device.device_id),
                        col(Device.push_token),
                        col(Device.opted_in),
                        col(Device.logged_in),
                        col(Device.unregistered_at),
                        col(Device.uninstalled_at),
                    )
                    .where(col(Device.app_id).in_(app_ids))
                    .where(col(Device.user_id).in_(batch))
                    .order_by(col(Device.app_id), col(Device.user_id), col(Device.device_id))
                ).all()
            )
    return rows


def _pre_send_outcome(
    *,
    channel: Channel,
    token: str | None,
    opted_in: bool,
    logged_in: bool,
    unregistered_at: datetime | None,
    uninstalled_at: datetime | None,
) -> str:
    if unregistered_at is not None or uninstalled_at is not None:
        return APP_UNINSTALLED
    if not logged_in:
        return NOT_LOGGED_IN
    if channel == Channel.push and (not opted_in or not token):
        return OPT_OUT
    return ""


def resolve_targets(
    *, users: Sequence[str], apps: Sequence[AppTarget], channel: Channel
) -> list[Target]:
    """Every report row of a chunk, app by app, message by message, device by device."""
    app_ids = [app.app_id for app in apps]
    devices: dict[tuple[str, str], list[Any]] = {}
    for row in _device_rows(app_ids, sorted(set(users))):
        devices.setdefault((row[0], row[1]), []).append(row)
    with_device = {user for _, user in devices}
    targets: list[Target] = []
    for app_id in app_ids:
        for index, user in enumerate(users):
            found = devices.get((app_id, user))
            if not found:
                if user not in with_device:
                    targets.append(Target(index, app_id, user, "", "", NO_DEVICE))
                continue
            for _, _, device_id, token, opted_in, logged_in, unregistered, uninstalled in found:
                outcome = _pre_send_outcome(
                    channel=channel,
                    token=token,
                    opted_in=opted_in,
                    logged_in=logged_in,
                    unregistered_at=unregistered,
                    uninstalled_at=uninstalled,
                )
                targets.append(Target(index, app_id, user, device_id, token or "", outcome))
    return targets
