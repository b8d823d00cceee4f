"""Helpers of the API tests: tenants made with the store tables and the real server
(uvicorn in a subprocess on a free port). Imported by name (``from api_tenants import
...``); the fixtures live in ``conftest.py``."""

from __future__ import annotations

import itertools
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from campaign_trigger.config import get_settings
from campaign_trigger.services.auth import hash_password, issue_token
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import (
    Account,
    App,
    Campaign,
    CampaignApp,
    CampaignState,
    Channel,
    Organisation,
    Platform,
    Role,
)
from support import VENV_BIN, ManagedProcess, free_port, wait_http

PASSWORD = "correct horse battery"
_counter = itertools.count()


@dataclass
class Tenant:
    """An organisation with one account per role and campaigns in every state."""

    org_id: int
    name: str
    emails: dict[Role, str]
    started: str  # variables: first_name, code
    plain: str  # started, no variables
    draft: str
    ended: str
    inapp: str
    tokens: dict[Role, str] = field(default_factory=dict)

    def auth(self, role: Role = Role.member) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[role]}"}


def make_tenant(*, quota: int = 1_000_000, quota_period: str = "monthly") -> Tenant:
    """A fresh organisation (unique names), its accounts, apps and campaigns."""
    tag = f"{next(_counter)}-{uuid.uuid4().hex[:8]}"
    settings = get_settings()
    password_hash = hash_password(PASSWORD)
    with session_scope() as session:
        org = Organisation(name=f"org-{tag}", request_quota=quota, quota_period=quota_period)
        session.add(org)
        session.flush()
        assert org.id is not None
        org_id = org.id  # narrowed for the closure below
        accounts = {
            role: Account(
                org_id=org.id,
                email=f"{role.value}-{tag}@example.com",
                password_hash=password_hash,
                role=role,
            )
            for role in Role
        }
        session.add_all(accounts.values())
        app = App(
            app_id=f"app-{tag}", org_id=org.id, platform=Platform.android, sdk_key=f"sdk-{tag}"
        )
        session.add(app)
        session.flush()

        def campaign(
            state: CampaignState,
            title: str,
            body: str,
            variables: list[str],
            channel: Channel = Channel.push,
        ) -> str:
            row = Campaign(
                org_id=org_id,
                channel=channel,
                state=state,
                title=title,
                body=body,
                variables=variables,
            )
            session.add(row)
            session.flush()
            session.add(CampaignApp(campaign_id=row.id, app_id=app.app_id))
            return row.id

        tenant = Tenant(
            org_id=org.id,
            name=org.name,
            emails={role: account.email for role, account in accounts.items()},
            started=campaign(
                CampaignState.started,
                "Hi {{ first_name }}",
                "Code {{ code }}",
                ["first_name", "code"],
            ),
            plain=campaign(CampaignState.started, "Hello", "World", []),
            draft=campaign(CampaignState.draft, "Hi {{ first_name }}", "x", ["first_name"]),
            ended=campaign(CampaignState.ended, "Hi {{ first_name }}", "x", ["first_name"]),
            inapp=campaign(
                CampaignState.started, "In {{ first_name }}", "x", ["first_name"], Channel.inapp
            ),
        )
        session.flush()
        tenant.tokens = {
            role: issue_token(settings=settings, account=account)
            for role, account in accounts.items()
        }
    return tenant


@dataclass
class Server:
    url: str
    process: ManagedProcess


def start_api_server(log_dir: Path, **env: str) -> Server:
    port = free_port()
    argv = [
        str(VENV_BIN / "uvicorn"),
        "--factory",
        "campaign_trigger.api.app:serve_app",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--no-access-log",
        "--log-level",
        "warning",
    ]
    process = ManagedProcess(
        "api",
        argv,
        log_dir=log_dir,
        env={"CT_API_RECONCILER": "false", "CT_PUBLIC_BASE_URL": f"http://127.0.0.1:{port}", **env},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/openapi.json", timeout=60, process=process)  # /health: 503 sans Prefect
    except BaseException:
        process.stop()
        raise
    return Server(url=url, process=process)
