"""The migrations build the same schema as the models, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlmodel import SQLModel

from campaign_trigger.store import models  # noqa: F401
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.migrate import HEAD, MIGRATIONS, downgrade, upgrade
from support import probe_output


def _tables(url: str) -> set[str]:
    return set(sa.inspect(engine_for(url)).get_table_names()) - {"alembic_version"}


def _round_trip(url: str) -> None:
    upgrade(url)
    assert _tables(url) == set(SQLModel.metadata.tables)
    downgrade(url, "base")
    assert _tables(url) == set()
    upgrade(url)
    assert _tables(url) == set(SQLModel.metadata.tables)


def test_migrations_round_trip_on_sqlite(tmp_path: Path) -> None:
    _round_trip(f"sqlite:///{tmp_path / 'db.sqlite'}")


@pytest.mark.postgres
def test_migrations_round_trip_on_postgres(postgres_url: str) -> None:
    _round_trip(postgres_url)


def test_head_names_the_newest_migration() -> None:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    assert ScriptDirectory.from_config(config).get_heads() == [HEAD]


def test_a_database_at_head_is_left_alone_without_loading_alembic(tmp_path: Path) -> None:
    """Every admin command migrates first: at head, that is one read, not Alembic."""
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    check = (
        "import sys\n"
        "from campaign_trigger.store.migrate import upgrade\n"
        f"upgrade({url!r})\n"
        "print('alembic' in sys.modules)\n"
    )

    def loads_alembic() -> str:
        return probe_output(check).strip()

    assert loads_alembic() == "True"  # a new database: migrated
    assert _tables(url) == set(SQLModel.metadata.tables)
    assert loads_alembic() == "False"  # at head: left alone
    downgrade(url, "0006_webhooks")
    assert loads_alembic() == "True"  # behind: migrated
    assert "device" in _tables(url)
    with engine_for(url).connect() as connection:
        version = connection.execute(sa.text("SELECT version_num FROM alembic_version"))
        assert version.scalar_one() == HEAD


def test_models_match_the_latest_migration(tmp_path: Path) -> None:
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url)
    with engine_for(url).connect() as connection:
        diff = compare_metadata(MigrationContext.configure(connection), SQLModel.metadata)
    assert diff == [], f"models changed without a migration: {diff}"


def test_existing_apps_get_an_identity_key_of_their_own(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    upgrade(url, "0001")
    when = "2026-01-01 00:00:00.000000"
    with engine_for(url).begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO organisation (id, name, request_quota, quota_period, created_at) "
                "VALUES (1, 'o', 1, 'monthly', :when)"
            ),
            {"when": when},
        )
        connection.execute(
            sa.text(
                "INSERT INTO app (app_id, org_id, platform, sdk_key, created_at) "
                "VALUES (:app, 1, 'ios', :key, :when)"
            ),
            [{"app": f"a{n}", "key": f"k{n}", "when": when} for n in range(2)],
        )
        connection.execute(
            sa.text(
                "INSERT INTO device (app_id, device_id, opted_in, logged_in, updated_at) "
                "VALUES ('a0', 'd', 1, 1, :when)"
            ),
            {"when": when},
        )
    upgrade(url)
    with engine_for(url).connect() as connection:
        apps = connection.execute(
            sa.text("SELECT identity_key, identity_verification FROM app")
        ).all()
        secret = connection.execute(sa.text("SELECT secret_hash FROM device")).scalar()
    keys = [key for key, _ in apps]
    assert all(key.startswith("idk_") for key in keys)
    assert len(set(keys)) == 2
    assert [bool(on) for _, on in apps] == [False, False]
    assert secret is None  # claimed later by its push token
    downgrade(url, "0001")  # with devices referencing the apps: no table is copied
    with engine_for(url).connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM app")).scalar() == 2


def _seed_requests_at_0001(url: str) -> None:
    """A request with messages, outcomes and a recorded chunk, as 0001 stored them."""
    when = "2026-01-01 00:00:00.000000"
    statements = [
        "INSERT INTO organisation (id, name, request_quota, quota_period, created_at) "
        "VALUES (1, 'o', 1, 'monthly', :when)",
        "INSERT INTO campaign (id, org_id, channel, state, title, body, variables, created_at) "
        "VALUES ('c', 1, 'push', 'started', 't', 'b', '[]', :when)",
        "INSERT INTO request (id, org_id, campaign_id, requested_at, send_at, source, "
        "message_count, state, report_paths) "
        "VALUES ('r', 1, 'c', :when, :when, 'json', 2, 'processed', '[]')",
        "INSERT INTO requestmessage (request_id, seq, user_id, template_variables) "
        "VALUES ('r', 0, 'u1', '{}'), ('r', 1, 'u2', '{}')",
        "INSERT INTO deliveredchunk (request_id, chunk_no, recorded_at) VALUES ('r', 0, :when)",
        "INSERT INTO outcome (request_id, chunk_no, app_id, user_id, device_id, channel, "
        "error_message) VALUES ('r', 0, 'a', 'u1', 'd1', 'push', ''), "
        "('r', 0, 'a', 'u2', 'd1', 'push', '')",
    ]
    with engine_for(url).begin() as connection:
        for statement in statements:
            connection.execute(sa.text(statement), {"when": when})


def _upgrade_with_requests(url: str) -> None:
    upgrade(url, "0001")
    _seed_requests_at_0001(url)
    upgrade(url)
    with engine_for(url).connect() as connection:
        request = connection.execute(
            sa.text("SELECT chunk_size, run_owner FROM request WHERE id = 'r'")
        ).one()
        rows = connection.execute(sa.text("SELECT row_no FROM outcome ORDER BY id")).all()
        kept = connection.execute(sa.text("SELECT count(*) FROM requestmessage")).scalar()
    assert tuple(request) == (5000, None)
    assert len({row for (row,) in rows}) == 2  # distinct: the unique key holds
    assert kept == 2
    downgrade(url, "0001")
    with engine_for(url).connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM outcome")).scalar() == 2


def test_requests_messages_and_outcomes_survive_the_exactly_once_migration(
    tmp_path: Path,
) -> None:
    _upgrade_with_requests(f"sqlite:///{tmp_path / 'db.sqlite'}")


@pytest.mark.postgres
def test_requests_messages_and_outcomes_survive_the_exactly_once_migration_on_postgres(
    postgres_url: str,
) -> None:
    _upgrade_with_requests(postgres_url)


def _credentials_migration(url: str) -> None:
    """0004 adds the sealed credentials of apps beside the existing apps, and drops them."""
    upgrade(url, "0003")
    when = "2026-01-01 00:00:00.000000"
    with engine_for(url).begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO organisation (id, name, request_quota, quota_period, created_at) "
                "VALUES (1, 'o', 1, 'monthly', :when)"
            ),
            {"when": when},
        )
        connection.execute(
            sa.text(
                "INSERT INTO app (app_id, org_id, platform, sdk_key, identity_key, "
                "identity_verification, created_at) VALUES ('a', 1, 'ios', 'k', 'i', false, :when)"
            ),
            {"when": when},
        )
    upgrade(url)
    with engine_for(url).begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO appcredentials (app_id, service, key_id, team_id, topic, "
                "environment, public_key_sha256, sealed_secret, version, updated_at) "
                "VALUES ('a', 'apns', 'K', 'T', 'com.x.y', 'production', 'f', 'v1.x', 1, :when)"
            ),
            {"when": when},
        )
        # one row per app
        with pytest.raises(sa.exc.IntegrityError), connection.begin_nested():
            connection.execute(
                sa.text(
                    "INSERT INTO appcredentials (app_id, service, key_id, "
                    "public_key_sha256, sealed_secret, version, updated_at) "
                    "VALUES ('a', 'fcm', 'K', 'f', 'v1.x', 1, :when)"
                ),
                {"when": when},
            )
    downgrade(url, "0003")
    assert "appcredentials" not in _tables(url)
    with engine_for(url).connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM app")).scalar() == 1


def test_app_credentials_migrate_up_and_down(tmp_path: Path) -> None:
    _credentials_migration(f"sqlite:///{tmp_path / 'db.sqlite'}")


@pytest.mark.postgres
def test_app_credentials_migrate_up_and_down_on_postgres(postgres_url: str) -> None:
    _credentials_migration(postgres_url)


def _payload_migration(url: str) -> None:
    """0005: existing campaigns send what they sent, existing inbox entries never expire."""
    upgrade(url, "0004")
    when = "2026-01-01 00:00:00.000000"
    with engine_for(url).begin() as connection:
        for statement in (
            "INSERT INTO organisation (id, name, request_quota, quota_period, created_at) "
            "VALUES (1, 'o', 1, 'monthly', :when)",
            "INSERT INTO campaign (id, org_id, channel, state, title, body, variables, "
            "created_at) VALUES ('c', 1, 'push', 'started', 't', 'b', '[]', :when)",
            "INSERT INTO inboxmessage (app_id, device_id, user_id, request_id, campaign_id, "
            "title, body, published_at) VALUES ('a', 'd', 'u', 'r', 'c', 't', 'b', :when)",
        ):
            connection.execute(sa.text(statement), {"when": when})
    upgrade(url)
    with engine_for(url).connect() as connection:
        campaign = connection.execute(
            sa.text(
                "SELECT data, image, sound, badge, priority, ttl_seconds, interruption_level, "
                "thread_id, category, silent FROM campaign"
            )
        ).one()
        entry = connection.execute(
            sa.text("SELECT data, image, expires_at FROM inboxmessage")
        ).one()
    data = campaign[0] if isinstance(campaign[0], dict) else json.loads(campaign[0])
    assert (data, *campaign[1:9], bool(campaign[9])) == (
        {}, None, None, None, "high", None, None, None, None, False
    )  # fmt: skip
    entry_data = entry[0] if isinstance(entry[0], dict) else json.loads(entry[0])
    assert (entry_data, entry[1], entry[2]) == ({}, None, None)
    downgrade(url, "0004")
    with engine_for(url).connect() as connection:
        assert connection.execute(sa.text("SELECT title FROM campaign")).scalar() == "t"


def test_complete_payload_columns_migrate_with_defaults(tmp_path: Path) -> None:
    _payload_migration(f"sqlite:///{tmp_path / 'db.sqlite'}")


@pytest.mark.postgres
def test_complete_payload_columns_migrate_with_defaults_on_postgres(postgres_url: str) -> None:
    _payload_migration(postgres_url)


def _webhooks_migration(url: str) -> None:
    """0006_webhooks adds the endpoints, their outbox and attempts, and drops them."""
    upgrade(url, "0005")
    when = "2026-01-01 00:00:00.000000"
    with engine_for(url).begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO organisation (id, name, request_quota, quota_period, created_at) "
                "VALUES (1, 'o', 1, 'monthly', :when)"
            ),
            {"when": when},
        )
    upgrade(url)
    with engine_for(url).begin() as connection:
        for statement in (
            "INSERT INTO webhookendpoint (id, org_id, url, sealed_secret, created_at) "
            "VALUES ('whk_1', 1, 'https://e.com', 'v1.x', :when)",
            "INSERT INTO webhookdelivery (id, endpoint_id, event_id, event_type, request_id, "
            "payload, created_at, next_attempt_at, attempt_count) VALUES (1, 'whk_1', 'evt_1', "
            "'request.failed', 'r', '{}', :when, :when, 0)",
            "INSERT INTO webhookattempt (delivery_id, attempted_at, status_code, duration_ms) "
            "VALUES (1, :when, 500, 3)",
        ):
            connection.execute(sa.text(statement), {"when": when})
        # one delivery of an event per endpoint
        with pytest.raises(sa.exc.IntegrityError), connection.begin_nested():
            connection.execute(
                sa.text(
                    "INSERT INTO webhookdelivery (endpoint_id, event_id, event_type, "
                    "request_id, payload, created_at, attempt_count) VALUES ('whk_1', 'evt_1', "
                    "'request.failed', 'r', '{}', :when, 0)"
                ),
                {"when": when},
            )
    downgrade(url, "0005")
    assert not {"webhookendpoint", "webhookdelivery", "webhookattempt"} & _tables(url)
    with engine_for(url).connect() as connection:
        assert connection.execute(sa.text("SELECT count(*) FROM organisation")).scalar() == 1


def test_webhook_tables_migrate_up_and_down(tmp_path: Path) -> None:
    _webhooks_migration(f"sqlite:///{tmp_path / 'db.sqlite'}")


@pytest.mark.postgres
def test_webhook_tables_migrate_up_and_down_on_postgres(postgres_url: str) -> None:
    _webhooks_migration(postgres_url)


def _token_owner_migration(url: str) -> None:
    """0008: a token held by several devices of an app stays with the newest row only."""
    upgrade(url, "0007_device_fillfactor")
    statements = [
        "INSERT INTO organisation (id, name, request_quota, quota_period, created_at) "
        "VALUES (1, 'o', 1, 'monthly', '2026-01-01 00:00:00.000000')",
        "INSERT INTO app (app_id, org_id, platform, sdk_key, identity_key, "
        "identity_verification, created_at) VALUES ('a', 1, 'ios', 'k', 'i', false, "
        "'2026-01-01 00:00:00.000000'), ('b', 1, 'ios', 'l', 'j', false, "
        "'2026-01-01 00:00:00.000000')",
    ]
    devices = [  # (app, device, token, updated on 2026-01-<day>)
        ("a", "old", "t", 1),
        ("a", "new", "t", 3),
        ("a", "older", "t", 1),
        ("a", "own", "u", 1),
        ("a", "none", None, 1),
        ("b", "other-app", "t", 1),
    ]
    with engine_for(url).begin() as connection:
        for statement in statements:
            connection.execute(sa.text(statement))
        connection.execute(
            sa.text(
                "INSERT INTO device (app_id, device_id, user_id, push_token, opted_in, "
                "logged_in, updated_at) VALUES (:app, :device, 'u', :token, true, true, :when)"
            ),
            [
                {"app": app, "device": device, "token": token, "when": f"2026-01-0{day} 00:00:00"}
                for app, device, token, day in devices
            ],
        )
    upgrade(url)
    with engine_for(url).connect() as connection:
        rows = connection.execute(
            sa.text("SELECT device_id, push_token, uninstalled_at FROM device")
        ).all()
    after = {device: (token, gone is not None) for device, token, gone in rows}
    assert after == {
        "old": (None, True),
        "new": ("t", False),
        "older": (None, True),
        "own": ("u", False),
        "none": (None, False),
        "other-app": ("t", False),
    }
    assert "ix_device_push_token" in {
        i["name"] for i in sa.inspect(engine_for(url)).get_indexes("device")
    }
    downgrade(url, "0007_device_fillfactor")
    indexes = {i["name"] for i in sa.inspect(engine_for(url)).get_indexes("device")}
    assert "ix_device_push_token" not in indexes


def test_a_token_held_by_several_devices_stays_with_the_newest_on_sqlite(tmp_path: Path) -> None:
    _token_owner_migration(f"sqlite:///{tmp_path / 'db.sqlite'}")


@pytest.mark.postgres
def test_a_token_held_by_several_devices_stays_with_the_newest_on_postgres(
    postgres_url: str,
) -> None:
    _token_owner_migration(postgres_url)
