"""The service's processes on free ports, and a seeded tenant, for tests that drive it
from outside: the HTTP API, a delivery worker and the sandbox providers, each a real
``campaign-trigger`` subprocess sharing the session's ``CT_HOME`` database and the
session's Prefect server (``PREFECT_API_URL``).

Importable as ``from integration.client.running_stack import ...``.
"""

from __future__ import annotations

import csv
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import httpx

from campaign_trigger.services import admin, devices
from campaign_trigger.store.db import session_scope
from support import VENV_BIN, ManagedProcess, free_port, wait_http

T = TypeVar("T")
PASSWORD = "correct horse battery"
TITLE = "Hello {{ first_name }}"
BODY = "Order {{ order_id }} is on its way"


@dataclass
class RunningStack:
    api_url: str
    sandbox_url: str
    env: dict[str, str]
    processes: list[ManagedProcess] = field(default_factory=list)

    def logs(self) -> str:
        return "\n\n".join(f"--- {p.name}\n{p.log_tail(60)}" for p in self.processes)


@contextmanager
def running_stack(
    log_dir: Path, *, worker: bool = True, extra_env: dict[str, str] | None = None
) -> Iterator[RunningStack]:
    """Sandbox, API and (optionally) a delivery worker; stopped on exit."""
    exe = str(VENV_BIN / "campaign-trigger")
    api_port, sandbox_port = free_port(), free_port()
    env = {
        "CT_API_PORT": str(api_port),
        "CT_SANDBOX_PORT": str(sandbox_port),
        "CT_SANDBOX_TLS_PORT": str(free_port()),  # not 8443: another stack may hold it
        **(extra_env or {}),
    }
    stack = RunningStack(
        api_url=f"http://127.0.0.1:{api_port}",
        sandbox_url=f"http://127.0.0.1:{sandbox_port}",
        env=env,
    )
    try:
        sandbox = ManagedProcess("sandbox", [exe, "sandbox"], env=env, log_dir=log_dir)
        stack.processes.append(sandbox)
        api = ManagedProcess("api", [exe, "api"], env=env, log_dir=log_dir)
        stack.processes.append(api)
        delivery = None
        if worker:
            delivery = ManagedProcess("worker", [exe, "worker"], env=env, log_dir=log_dir)
            stack.processes.append(delivery)
        wait_http(f"{stack.sandbox_url}/sandbox/stats", timeout=60, process=sandbox)
        wait_http(f"{stack.api_url}/health", timeout=60, process=api)
        if delivery is not None:  # its deployments registered: a send finds them
            delivery.wait_logged(" ready: polling")
        yield stack
    finally:
        for process in reversed(stack.processes):
            process.stop()


@dataclass(frozen=True)
class SeededTenant:
    org: str
    campaign_id: str
    member_email: str
    viewer_email: str
    app_id: str
    users: list[str]
    password: str = PASSWORD


def seed_tenant(*, quota: int = 10_000, users: int = 3, started: bool = True) -> SeededTenant:
    """An organisation with a member, a viewer, an Android app, devices that the sandbox
    accepts for ``users`` users, and a push campaign (variables first_name, order_id)."""
    tag = uuid.uuid4().hex[:8]
    org, app_id = f"org-{tag}", f"android-{tag}"
    member, viewer = f"member-{tag}@example.com", f"viewer-{tag}@example.com"
    user_ids = [f"user-{tag}-{n}" for n in range(1, users + 1)]
    with session_scope() as session:
        admin.create_org(session=session, name=org, quota=quota)
        admin.create_account(session=session, org_name=org, email=member, password=PASSWORD)
        admin.create_account(
            session=session, org_name=org, email=viewer, password=PASSWORD, role="viewer"
        )
        admin.create_app(session=session, org_name=org, app_id=app_id, platform="android")
        campaign = admin.create_campaign(
            session=session,
            org_name=org,
            app_ids=[app_id],
            channel="push",
            title=TITLE,
            body=BODY,
            campaign_id=f"campaign-{tag}",
        )
        if started:
            admin.launch_campaign(session=session, campaign_id=campaign.id)
        devices.upsert_devices(
            session=session,
            app_id=app_id,
            rows=[
                {
                    "device_id": f"device-{u}",
                    "user_id": u,
                    "push_token": f"ok-{u}",
                    "opted_in": True,
                    "logged_in": True,
                }
                for u in user_ids
            ],
        )
    return SeededTenant(
        org=org,
        campaign_id=campaign.id,
        member_email=member,
        viewer_email=viewer,
        app_id=app_id,
        users=user_ids,
    )


def sign_in(api: str, tenant: SeededTenant, *, email: str | None = None) -> dict[str, str]:
    """The Authorization header of the tenant's member (or of ``email``) on the API."""
    signed = httpx.post(
        f"{api}/users/sign_in",
        json={"user": {"email": email or tenant.member_email, "password": tenant.password}},
    )
    assert signed.status_code == 200, signed.text
    return {"Authorization": signed.headers["Authorization"]}


def write_batch_csv(path: Path, users: list[str]) -> Path:
    with path.open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["User", "first_name", "order_id"])
        for n, user in enumerate(users):
            writer.writerow([user, f"Name{n}", f"O-{n}"])
    return path


def eventually(
    check: Callable[[], T],
    *,
    timeout: float = 60.0,
    every: float = 0.5,
    retry_on: tuple[type[Exception], ...] = (AssertionError,),
) -> T:
    """``check()``'s value once it stops raising ``retry_on`` (else its last error)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return check()
        except retry_on:
            if time.monotonic() > deadline:
                raise
            time.sleep(every)
