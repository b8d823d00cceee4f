"""The bulk device import on SQLite (batched upsert) and PostgreSQL (COPY): what it
writes, what it keeps, and the refusals of a bad file (the first bad row, whole)."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import Session, col, select

from campaign_trigger.errors import AdminError
from campaign_trigger.services.admin import import_devices
from campaign_trigger.services.audience import APP_UNINSTALLED, AppTarget, resolve_targets
from campaign_trigger.services.devices import log_in, register_device
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.migrate import upgrade
from campaign_trigger.store.models import App, Channel, Device, Organisation, Platform

HEADER = "device_id,user_id,push_token,opted_in,logged_in\n"


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A migrated database of each kind (PostgreSQL skips loudly when none answers)."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'devices.db'}"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    upgrade(url)
    return url


@pytest.fixture
def app_id(database: str) -> str:
    return _new_app(database)


def _new_app(database: str) -> str:
    with Session(engine_for(database)) as session:
        org = Organisation(name=f"org-{uuid.uuid4().hex[:8]}")
        session.add(org)
        session.flush()
        assert org.id is not None
        app = App(
            app_id=f"app-{org.id}", org_id=org.id, platform=Platform.ios, sdk_key=f"k-{org.id}"
        )
        session.add(app)
        session.commit()
        return app.app_id


def _import(database: str, app_id: str, path: Path, content: str) -> int:
    path.write_text(content, encoding="utf-8")
    seen: list[tuple[int, int]] = []
    with Session(engine_for(database)) as session:
        count = import_devices(
            session=session, app_id=app_id, path=path, progress=lambda d, t: seen.append((d, t))
        )
        session.commit()
    assert seen[-1] == (count, count)
    return count


def _devices(database: str, app_id: str) -> dict[str, Device]:
    with Session(engine_for(database)) as session:
        rows = session.exec(select(Device).where(Device.app_id == app_id)).all()
        return {row.device_id: row for row in rows}


def test_import_inserts_then_updates_by_the_registration_rule(
    database: str, app_id: str, tmp_path: Path
) -> None:
    path = tmp_path / "devices.csv"
    content = HEADER + " d1 , u1 ,tok-1,TRUE,yes\nd2,u2,tok-2,false,1\nd3,,,t,N\n"
    assert _import(database, app_id, path, content) == 3
    first = _devices(database, app_id)
    assert {k: (d.user_id, d.push_token, d.opted_in, d.logged_in) for k, d in first.items()} == {
        "d1": ("u1", "tok-1", True, True),
        "d2": ("u2", "tok-2", False, True),
        "d3": (None, None, True, False),
    }
    # a provider said d1's and d2's tokens are gone; d2 was uninstalled; d1 has a secret
    gone = datetime(2026, 1, 1, tzinfo=UTC)
    with Session(engine_for(database)) as session:
        for device in session.exec(select(Device).where(Device.app_id == app_id)).all():
            if device.device_id in ("d1", "d2"):
                device.unregistered_at = gone
            if device.device_id == "d2":
                device.uninstalled_at = gone
            if device.device_id == "d1":
                device.secret_hash = "a" * 64
            session.add(device)
        session.commit()
    # d1 keeps its token (still unregistered), d2 gets a new one (registered again)
    content = HEADER + "d1,u9,tok-1,true,false\nd2,u2,tok-new,true,true\nd4,u4,tok-4,1,1\n"
    assert _import(database, app_id, path, content) == 3
    after = _devices(database, app_id)
    assert set(after) == {"d1", "d2", "d3", "d4"}
    d1, d2 = after["d1"], after["d2"]
    assert (d1.user_id, d1.push_token, d1.logged_in, d1.secret_hash) == (
        "u9",
        "tok-1",
        False,
        "a" * 64,
    )
    assert d1.unregistered_at == gone
    assert (d2.push_token, d2.unregistered_at, d2.uninstalled_at) == ("tok-new", None, None)
    assert after["d1"].id == first["d1"].id  # updated in place, not re-created
    assert after["d4"].updated_at > datetime.now(UTC) - timedelta(minutes=5)
    assert after["d3"].updated_at == first["d3"].updated_at  # not in the second file
    if database.startswith("sqlite"):  # stored as the ORM stores it: naive UTC text
        with Session(engine_for(database)) as session:
            stored = session.connection().exec_driver_sql("SELECT updated_at FROM device")
            texts = {str(value) for (value,) in stored}
        assert all(re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{6}", t) for t in texts), texts


def test_a_device_the_file_repeats_exactly_is_left_as_it_is(
    database: str, app_id: str, tmp_path: Path
) -> None:
    path = tmp_path / "devices.csv"
    content = HEADER + "d1,u1,tok-1,true,true\nd2,u2,tok-2,true,true\nd3,u3,tok-3,true,true\n"
    _import(database, app_id, path, content)
    before = _devices(database, app_id)
    with Session(engine_for(database)) as session:  # d3 was uninstalled since
        d3 = session.exec(select(Device).where(Device.app_id == app_id, Device.device_id == "d3"))
        device = d3.one()
        device.uninstalled_at = datetime(2026, 1, 1, tzinfo=UTC)
        session.add(device)
        session.commit()
    # d1 repeated exactly, d2 opts out, d3 comes back with the same values
    content = HEADER + "d1,u1,tok-1,true,true\nd2,u2,tok-2,false,true\nd3,u3,tok-3,true,true\n"
    assert _import(database, app_id, path, content) == 3
    after = _devices(database, app_id)
    assert after["d1"].updated_at == before["d1"].updated_at
    assert after["d2"].updated_at > before["d2"].updated_at
    assert after["d2"].opted_in is False
    assert after["d3"].uninstalled_at is None
    assert after["d3"].updated_at > before["d3"].updated_at


def test_a_token_imported_for_another_device_leaves_the_one_that_held_it(
    database: str, app_id: str, tmp_path: Path
) -> None:
    path = tmp_path / "devices.csv"
    _import(database, app_id, path, HEADER + "d1,alice,tok-t,true,true\nd2,carol,tok-c,1,1\n")
    other = _new_app(database)  # the same token in another app is another app's business
    _import(database, other, path, HEADER + "d1,alice,tok-t,true,true\n")
    # the app reinstalled on Alice's old phone, now Bob's: a new device id, the same token
    _import(database, app_id, path, HEADER + "d9,bob,tok-t,true,true\n")
    after = _devices(database, app_id)
    assert (after["d9"].push_token, after["d9"].user_id) == ("tok-t", "bob")
    assert (after["d1"].push_token, after["d1"].user_id) == (None, "alice")
    assert after["d1"].uninstalled_at is not None
    assert after["d2"].push_token == "tok-c"
    assert _devices(database, other)["d1"].push_token == "tok-t"
    # a token swapped between two known devices in one file: each keeps its new one
    _import(database, app_id, path, HEADER + "d2,carol,tok-t,1,1\nd9,bob,tok-c,1,1\n")
    after = _devices(database, app_id)
    tokens = {device_id: device.push_token for device_id, device in after.items()}
    assert tokens == {"d1": None, "d2": "tok-t", "d9": "tok-c"}


def _register_uncommitted(database: str, app_id: str, device_id: str, token: str) -> Session:
    """A new install registers ``token`` and Bob logs in on it; the transaction is left
    open (the caller commits)."""
    session = Session(engine_for(database))
    app = session.exec(select(App).where(App.app_id == app_id)).one()
    device = register_device(
        session=session, app_id=app_id, device_id=device_id, push_token=token
    ).device
    log_in(session=session, app=app, device=device, user_id="bob", identity_hash=None)
    session.flush()
    return session


@pytest.mark.postgres
@pytest.mark.parametrize("first", ["registration", "import"])
def test_an_import_and_a_registration_giving_one_token_at_once_reach_the_phone_once(
    postgres_url: str, tmp_path: Path, first: str
) -> None:
    # Read committed: the import and the registration each look for the token's other
    # holders before the other one committed, find none, and both keep the token.
    upgrade(postgres_url)
    app_id = _new_app(postgres_url)
    path = tmp_path / "devices.csv"
    path.write_text(HEADER + "d-import,alice,tok-t,true,true\n", encoding="utf-8")
    with Session(engine_for(postgres_url)) as importing:
        if first == "registration":
            registering = _register_uncommitted(postgres_url, app_id, "d-app", "tok-t")
            import_devices(session=importing, app_id=app_id, path=path)
            importing.commit()
        else:
            import_devices(session=importing, app_id=app_id, path=path)
            registering = _register_uncommitted(postgres_url, app_id, "d-app", "tok-t")
            importing.commit()
        registering.commit()
        registering.close()
    with Session(engine_for(postgres_url)) as session:
        targets = resolve_targets(
            session=session,
            users=["alice", "bob"],
            apps=[AppTarget(app_id, Platform.ios)],
            channel=Channel.push,
        )
        sent = [(t.device_id, t.token) for t in targets if not t.error_message]
        assert len(sent) == 1, targets  # one message for the phone, one user's
        assert [t.error_message for t in targets if t.error_message] == [APP_UNINSTALLED]
        newest = session.exec(
            select(Device.device_id)
            .where(Device.app_id == app_id, Device.push_token == "tok-t")
            .order_by(col(Device.updated_at).desc(), col(Device.id).desc())
        ).first()
        assert sent == [(newest, "tok-t")]


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        ("d1,u,t1,true,true\nd2,u,t2,maybe,true\nd3,u,t3,true,true,x\n", "Line 3: opted_in"),
        ("d1,u,t1,true,true\nd2,u,t2,true,true,x\nd3,u,t3,nope,true\n", "Line 3: wrong number"),
        ("d1,u,t1,true,true\nd2,u,t2\n", "Line 3: wrong number of fields"),
        ("d1,u,t1,true,true\n  ,u,t5,true,true\n", "Line 3: device_id is empty"),
        ("d1,u,t1,true,true\nd2,u,t2,true,true\n d1,u,t1,true,true\n", "Line 4: device_id 'd1'"),
        ("d1,u,t1,true,true\nd2,u,t2,true,sometimes\n", "Line 3: logged_in must be true or false"),
        ("d1,u,t1,true,true\nd1,u,t1,maybe,true\n", "Line 3: device_id 'd1' appears twice"),
        (
            "d1,u,t1,true,true\nd2,u,t2,true,true\nd3,u, t1 ,true,true\n",
            "Line 4: push_token of line 2",
        ),
    ],
)
def test_a_bad_file_is_refused_whole_at_its_first_bad_row(
    database: str, app_id: str, tmp_path: Path, rows: str, reason: str
) -> None:
    with pytest.raises(AdminError, match=reason):
        _import(database, app_id, tmp_path / "devices.csv", HEADER + rows)
    assert _devices(database, app_id) == {}


def test_missing_columns_and_bad_bytes_are_refused(
    database: str, app_id: str, tmp_path: Path
) -> None:
    path = tmp_path / "devices.csv"
    with pytest.raises(AdminError, match="lacks column"):
        _import(database, app_id, path, "device_id,user_id\nd1,u1\n")
    path.write_bytes(HEADER.encode() + b"d1,u\xff,t,true,true\n")
    with Session(engine_for(database)) as session, pytest.raises(AdminError, match="Cannot read"):
        import_devices(session=session, app_id=app_id, path=path)
    assert _devices(database, app_id) == {}


@pytest.mark.postgres
def test_new_flags_leave_the_indexes_alone_on_postgres(postgres_url: str, tmp_path: Path) -> None:
    # half of each page free (migration 0007): every row's new version fits on its page;
    # a new token is not such an update since migration 0008 indexes tokens
    upgrade(postgres_url)
    app_id = _new_app(postgres_url)
    rows = [f"d{n},u{n},tok-{n:060d},{{opted_in}},true\n" for n in range(500)]
    path = tmp_path / "devices.csv"
    _import(postgres_url, app_id, path, HEADER + "".join(rows).format(opted_in="true"))
    path.write_text(HEADER + "".join(rows).format(opted_in="false"), encoding="utf-8")
    with Session(engine_for(postgres_url)) as session:
        import_devices(session=session, app_id=app_id, path=path)
        counts = session.connection().exec_driver_sql(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables WHERE relname = 'device'"
        )
        assert tuple(counts.one()) == (500, 500)  # all heap-only: no index entry written
        session.commit()


@pytest.mark.postgres
def test_tokens_moved_between_devices_of_the_file_write_each_device_once_on_postgres(
    postgres_url: str, tmp_path: Path
) -> None:
    # Each device given the token the next one had: every token is taken from a device the
    # file names, which the update rewrites anyway. Taken first, each of those was written
    # twice (1 M devices: 35 s against 20 s, docs/benchmarks.md).
    upgrade(postgres_url)
    app_id = _new_app(postgres_url)
    path = tmp_path / "devices.csv"
    rows = "".join(f"d{n},u{n},tok-{{shift}}{n:03d},true,true\n" for n in range(100))
    _import(postgres_url, app_id, path, HEADER + rows.format(shift="a"))
    moved = "".join(f"d{n},u{n},tok-a{n + 1:03d},true,true\n" for n in range(100))
    path.write_text(HEADER + moved, encoding="utf-8")
    with Session(engine_for(postgres_url)) as session:
        import_devices(session=session, app_id=app_id, path=path)
        counts = session.connection().exec_driver_sql(
            "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relname = 'device'"
        )
        assert counts.scalar_one() == 100
        session.commit()
    after = _devices(postgres_url, app_id)
    assert {d: (after[d].push_token, after[d].uninstalled_at) for d in ("d0", "d99")} == {
        "d0": ("tok-a001", None),
        "d99": ("tok-a100", None),
    }
