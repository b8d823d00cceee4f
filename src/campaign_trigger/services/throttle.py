"""Sign-in throttling: failed sign-ins per account and per client address, in a sliding
window kept in the database, so that every API process shares one count.

An attempt is recorded as a failure *before* its password is checked (:func:`reserve`)
and forgotten if it succeeds (:func:`succeeded`, which also resets the account's
count). So concurrent attempts, from any process, count each other: after recording,
:func:`confirm` counts the attempts recorded before this one, and the one that would
pass the budget is refused and forgotten. A refused attempt costs no password hash and
is not recorded, so the window keeps sliding: an account locked by a burst of failures
opens again ``sign_in_window_seconds`` after them.

Keys are ``account:`` or ``address:`` and a SHA-256: neither e-mail addresses nor
client addresses are stored in clear.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlmodel import Session, col, delete, select

from campaign_trigger.config import Settings
from campaign_trigger.store.models import SignInFailure

THROTTLED = "Too many failed sign-in attempts; try again later (see Retry-After)"


def _key(kind: str, value: str) -> str:
    digest = hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{kind}:{digest}"


@dataclass(frozen=True, slots=True)
class Reservation:
    """One attempt, recorded as a failure under both keys until it succeeds."""

    account_key: str
    address_key: str
    row_ids: tuple[int, int]
    started_at: datetime


def _budgets(settings: Settings, reservation_keys: tuple[str, str]) -> list[tuple[str, int]]:
    account_key, address_key = reservation_keys
    return [
        (account_key, settings.sign_in_account_failures),
        (address_key, settings.sign_in_address_failures),
    ]


def _wait(times: list[datetime], *, limit: int, window: timedelta, now: datetime) -> int | None:
    """Seconds until fewer than ``limit`` of ``times`` (ascending) are in the window."""
    if len(times) < limit:
        return None
    frees_at = times[len(times) - limit] + window
    return max(1, math.ceil((frees_at - now).total_seconds()))


def _times(
    session: Session, *, key: str, since: datetime, before_id: int | None = None
) -> list[datetime]:
    query = select(SignInFailure.failed_at).where(
        SignInFailure.key == key, col(SignInFailure.failed_at) >= since
    )
    if before_id is not None:
        query = query.where(col(SignInFailure.id) < before_id)
    return sorted(session.exec(query).all())


def reserve(
    *, session: Session, settings: Settings, email: str, address: str, now: datetime | None = None
) -> Reservation | int:
    """Record an attempt; or, when the account's or the address's budget is spent, record
    nothing and return the seconds to wait. Also forgets failures older than the window."""
    moment = now or datetime.now(UTC)
    window = timedelta(seconds=settings.sign_in_window_seconds)
    since = moment - window
    session.exec(delete(SignInFailure).where(col(SignInFailure.failed_at) < since))
    keys = (_key("account", email.strip().lower()), _key("address", address))
    waits = [
        _wait(_times(session, key=key, since=since), limit=limit, window=window, now=moment)
        for key, limit in _budgets(settings, keys)
    ]
    spent = [wait for wait in waits if wait is not None]
    if spent:
        return max(spent)
    rows = [SignInFailure(key=key, failed_at=moment) for key in keys]
    session.add_all(rows)
    session.flush()
    account_row, address_row = rows[0].id, rows[1].id
    assert account_row is not None
    assert address_row is not None
    return Reservation(
        account_key=keys[0],
        address_key=keys[1],
        row_ids=(account_row, address_row),
        started_at=moment,
    )


def confirm(*, session: Session, settings: Settings, reservation: Reservation) -> int | None:
    """Once the reservation is committed: None if the attempts recorded before it leave
    room for it; otherwise forget it and return the seconds to wait."""
    window = timedelta(seconds=settings.sign_in_window_seconds)
    since = reservation.started_at - window
    keys = (reservation.account_key, reservation.address_key)
    waits = []
    for (key, limit), row_id in zip(_budgets(settings, keys), reservation.row_ids, strict=True):
        earlier = _times(session, key=key, since=since, before_id=row_id)
        waits.append(_wait(earlier, limit=limit, window=window, now=reservation.started_at))
    spent = [wait for wait in waits if wait is not None]
    if not spent:
        return None
    session.exec(delete(SignInFailure).where(col(SignInFailure.id).in_(reservation.row_ids)))
    return max(spent)


def succeeded(*, session: Session, reservation: Reservation) -> None:
    """The attempt signed in: the account's count starts again; the address keeps its
    other failures (this attempt is not one of them)."""
    session.exec(delete(SignInFailure).where(col(SignInFailure.key) == reservation.account_key))
    session.exec(delete(SignInFailure).where(col(SignInFailure.id) == reservation.row_ids[1]))
