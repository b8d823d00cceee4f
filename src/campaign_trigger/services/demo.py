"""The demo tenant that ``campaign-trigger up`` seeds: an org, a member account, an
Android and an iOS app, a started push campaign and a few hundred devices whose
tokens exercise every outcome of the sandbox provider.
"""

from __future__ import annotations

import json
import secrets
from dataclasses import asdict, dataclass
from pathlib import Path

from sqlmodel import Session, select

from campaign_trigger.services import admin, devices
from campaign_trigger.store.models import Organisation
from campaign_trigger.store.private import private_file

ORG = "demo"
EMAIL = "demo@example.com"
CAMPAIGN_ID = "demo-campaign"
ANDROID_APP = "demo-android"
IOS_APP = "demo-ios"
USERS = 200


@dataclass(frozen=True)
class DemoTenant:
    org: str
    email: str
    password: str
    campaign_id: str
    app_ids: tuple[str, ...]


def _token(user_no: int, platform: str) -> str:
    """Mostly good tokens; a few of each failure kind the sandbox knows."""
    prefix = {7: "unregistered-", 11: "expired-", 13: "invalid-", 17: "flaky-", 19: "fail-"}
    for divisor, kind in prefix.items():
        if user_no % divisor == 0 and user_no % 2 == (0 if platform == "android" else 1):
            return f"{kind}{platform}-{user_no}"
    return f"{platform}-{secrets.token_hex(8)}"


def _device_rows(platform: str) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    for user_no in range(1, USERS + 1):
        if user_no % 23 == 0:
            continue  # "No device for user"
        rows.append(
            {
                "device_id": f"{platform}-device-{user_no}",
                "user_id": f"user-{user_no}",
                "push_token": _token(user_no, platform),
                "opted_in": user_no % 29 != 0,
                "logged_in": user_no % 31 != 0,
            }
        )
    return rows


def seed(*, session: Session, home: Path) -> DemoTenant:
    """Create the demo tenant once; later calls return the stored credentials."""
    credentials = home / "demo.json"
    exists = session.exec(select(Organisation).where(Organisation.name == ORG)).first()
    if exists and credentials.exists():
        stored = json.loads(credentials.read_text())
        return DemoTenant(**{**stored, "app_ids": (ANDROID_APP, IOS_APP)})
    password = secrets.token_urlsafe(12)
    admin.create_org(session=session, name=ORG, quota=100_000)
    admin.create_account(
        session=session, org_name=ORG, email=EMAIL, password=password, role="member"
    )
    for app_id, platform in ((ANDROID_APP, "android"), (IOS_APP, "ios")):
        admin.create_app(session=session, org_name=ORG, app_id=app_id, platform=platform)
        devices.upsert_devices(session=session, app_id=app_id, rows=_device_rows(platform))
    admin.create_campaign(
        session=session,
        org_name=ORG,
        app_ids=[ANDROID_APP, IOS_APP],
        channel="push",
        title="Hello {{ first_name }}",
        body="Your order {{ order_id }} ships today.",
        campaign_id=CAMPAIGN_ID,
        options={"data": {"link": "demo://orders/{{ order_id }}"}},  # a deep link per user
    )
    admin.launch_campaign(session=session, campaign_id=CAMPAIGN_ID)
    tenant = DemoTenant(
        org=ORG,
        email=EMAIL,
        password=password,
        campaign_id=CAMPAIGN_ID,
        app_ids=(ANDROID_APP, IOS_APP),
    )
    body = {key: value for key, value in asdict(tenant).items() if key != "app_ids"}
    for path, text in (
        (credentials, json.dumps(body, indent=2)),
        (home / "demo-password", password),
    ):
        private_file(path)  # 0600 before the password is written
        path.write_text(text)
    return tenant
