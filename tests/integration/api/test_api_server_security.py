"""Through the real HTTP server (uvicorn subprocess): sign-in, tokens (forged, expired,
revoked), roles, the request quota and isolation between organisations."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta

import httpx
import jwt
import pytest
from api_tenants import PASSWORD, Server, Tenant

from campaign_trigger.config import get_settings
from campaign_trigger.services.auth import issue_token
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Account, QuotaUsage, Role

MESSAGES = [{"user_id": "u1", "template_variables": {"first_name": "A", "code": "1"}}]


def _trigger(tenant: Tenant, campaign_id: str | None = None) -> dict[str, object]:
    return {
        "campaign_id": campaign_id or tenant.started,
        "messages": MESSAGES,
        "send_at": (datetime.now(UTC) + timedelta(hours=2)).isoformat(timespec="seconds"),
    }


@pytest.fixture
def http(api_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_server.url, timeout=30) as client:
        yield client


# --- sign-in -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/users/sign_in", "/users/sign_in.json"])
def test_sign_in_puts_a_bearer_token_in_the_authorization_header(
    http: httpx.Client, tenant: Tenant, path: str
) -> None:
    email = tenant.emails[Role.member]
    response = http.post(
        path,
        json={"user": {"email": email, "password": PASSWORD}},
        headers={"Accept": "application/json"},
    )
    assert response.status_code == 200, response.text
    assert response.headers["authorization"].startswith("Bearer ")
    assert response.json() == {"email": email, "role": "member", "organisation": tenant.name}
    listed = http.get(
        f"/api/campaigns/{tenant.started}/request/scheduled",
        headers={"Authorization": response.headers["authorization"]},
    )
    assert listed.status_code == 200, listed.text


def test_wrong_password_and_unknown_email_answer_alike(http: httpx.Client, tenant: Tenant) -> None:
    wrong = http.post(
        "/users/sign_in",
        json={"user": {"email": tenant.emails[Role.member], "password": "not the password"}},
    )
    unknown = http.post(
        "/users/sign_in", json={"user": {"email": "nobody@example.com", "password": PASSWORD}}
    )
    for response in (wrong, unknown):
        assert response.status_code == 401
        assert response.json() == {"error_message": "Invalid email or password"}
        assert "authorization" not in response.headers


@pytest.mark.parametrize(
    "body", [b"{", b"[]", b'{"user": "x"}', b'{"email": "a", "password": "b"}']
)
def test_sign_in_with_a_malformed_body_is_a_400(http: httpx.Client, body: bytes) -> None:
    response = http.post(
        "/users/sign_in", content=body, headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 400
    assert set(response.json()) == {"error_message"}


def test_sign_in_does_not_consume_quota(
    http: httpx.Client, tenant_factory: Callable[..., Tenant]
) -> None:
    tenant = tenant_factory(quota=1)
    for _ in range(3):
        response = http.post(
            "/users/sign_in",
            json={"user": {"email": tenant.emails[Role.owner], "password": PASSWORD}},
        )
        assert response.status_code == 200
    assert (
        http.get(
            f"/api/campaigns/{tenant.started}/request/scheduled", headers=tenant.auth()
        ).status_code
        == 200
    )


# --- tokens --------------------------------------------------------------------------


def _forged(tenant: Tenant) -> str:
    claims = jwt.decode(tenant.tokens[Role.member], options={"verify_signature": False})
    return jwt.encode(claims, "another secret, long enough for HS256 keys", algorithm="HS256")


def _alg_none(tenant: Tenant) -> str:
    _, payload, _ = tenant.tokens[Role.member].split(".")
    none = base64.urlsafe_b64encode(b'{"alg":"none","typ":"JWT"}').rstrip(b"=").decode()
    return f"{none}.{payload}."


def _expired(tenant: Tenant) -> str:
    with session_scope() as session:
        account = session.get(
            Account,
            jwt.decode(tenant.tokens[Role.member], options={"verify_signature": False})["sub"],
        )
        assert account is not None
        settings = get_settings()
        past = datetime.now(UTC) - timedelta(seconds=settings.token_ttl_seconds + 60)
        return issue_token(settings=settings, account=account, now=past)


@pytest.mark.parametrize(
    "make_header",
    [
        lambda t: None,
        lambda t: "",
        lambda t: "Bearer",
        lambda t: f"Basic {t.tokens[Role.member]}",
        lambda t: t.tokens[Role.member],
        lambda t: "Bearer not-a-jwt",
        lambda t: f"Bearer {t.tokens[Role.member]}x",
        lambda t: f"Bearer {_forged(t)}",
        lambda t: f"Bearer {_alg_none(t)}",
    ],
    ids=[
        "absent",
        "empty",
        "bearer-only",
        "basic",
        "no-scheme",
        "not-jwt",
        "tampered",
        "forged",
        "alg-none",
    ],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/api/campaigns/trigger"),
        ("PUT", "/api/campaigns/request/x/cancel"),
        ("GET", "/api/campaigns/x/request/scheduled"),
        ("GET", "/api/campaigns/report?request_id=x"),
        ("DELETE", "/users/sign_out"),
    ],
)
def test_bad_tokens_are_refused_with_401(
    http: httpx.Client,
    tenant: Tenant,
    make_header: Callable[[Tenant], str | None],
    method: str,
    path: str,
) -> None:
    value = make_header(tenant)
    headers = {} if value is None else {"Authorization": value}
    response = http.request(method, path, headers=headers, json=_trigger(tenant))
    assert response.status_code == 401, response.text
    assert response.json() == {"error_message": "Invalid or missing access token"}


def test_an_expired_token_is_refused(http: httpx.Client, tenant: Tenant) -> None:
    response = http.get(
        f"/api/campaigns/{tenant.started}/request/scheduled",
        headers={"Authorization": f"Bearer {_expired(tenant)}"},
    )
    assert response.status_code == 401
    assert response.json() == {
        "error_message": "The access token has expired, please sign in again"
    }


def test_sign_out_revokes_the_token_only(http: httpx.Client, tenant: Tenant) -> None:
    signed_in = http.post(
        "/users/sign_in", json={"user": {"email": tenant.emails[Role.member], "password": PASSWORD}}
    )
    token = {"Authorization": signed_in.headers["authorization"]}
    listing = f"/api/campaigns/{tenant.started}/request/scheduled"
    assert http.get(listing, headers=token).status_code == 200
    assert http.delete("/users/sign_out", headers=token).status_code == 204
    after = http.get(listing, headers=token)
    assert after.status_code == 401
    assert after.json() == {"error_message": "Invalid or missing access token"}
    assert http.delete("/users/sign_out", headers=token).status_code == 401
    assert http.get(listing, headers=tenant.auth()).status_code == 200  # other tokens live on


def test_a_deleted_account_token_is_refused(http: httpx.Client, tenant: Tenant) -> None:
    claims = jwt.decode(tenant.tokens[Role.admin], options={"verify_signature": False})
    with session_scope() as session:
        account = session.get(Account, int(claims["sub"]))
        session.delete(account)
    response = http.get(
        f"/api/campaigns/{tenant.started}/request/scheduled", headers=tenant.auth(Role.admin)
    )
    assert response.status_code == 401


@pytest.mark.parametrize("same_org", [False, True], ids=["another-org", "same-org"])
def test_a_deleted_account_token_does_not_sign_in_the_account_given_its_id(
    http: httpx.Client, tenant: Tenant, other_tenant: Tenant, same_org: bool
) -> None:
    """SQLite gives a new account the id of the newest one deleted (a rowid without
    AUTOINCREMENT): written here with that id, on any database."""
    settings = get_settings()
    now = datetime.now(UTC)
    with session_scope() as session:
        account = Account(
            org_id=tenant.org_id,
            email=f"gone-{tenant.name}@example.com",
            password_hash="x",
            created_at=now - timedelta(seconds=10),
        )
        session.add(account)
        session.flush()
        assert account.id is not None
        account_id = account.id
        old_token = issue_token(settings=settings, account=account, now=now - timedelta(seconds=5))
    listing = f"/api/campaigns/{tenant.started}/request/scheduled"
    assert http.get(listing, headers={"Authorization": f"Bearer {old_token}"}).status_code == 200
    owner = tenant if same_org else other_tenant
    with session_scope() as session:
        session.delete(session.get(Account, account_id))
        session.flush()
        session.add(
            Account(
                id=account_id,
                org_id=owner.org_id,
                email=f"new-{owner.name}-{same_org}@example.com",
                password_hash="x",
                role=Role.owner,
            )
        )
    listing = f"/api/campaigns/{owner.started}/request/scheduled"
    response = http.get(listing, headers={"Authorization": f"Bearer {old_token}"})
    assert response.status_code == 401, response.text
    assert response.json() == {"error_message": "Invalid or missing access token"}
    with session_scope() as session:  # the new account's own token works
        new_account = session.get(Account, account_id)
        assert new_account is not None
        fresh = issue_token(settings=settings, account=new_account)
    assert http.get(listing, headers={"Authorization": f"Bearer {fresh}"}).status_code == 200


# --- roles ---------------------------------------------------------------------------


@pytest.mark.parametrize("role", [Role.owner, Role.admin, Role.member])
def test_senders_may_create_and_cancel(http: httpx.Client, tenant: Tenant, role: Role) -> None:
    created = http.post("/api/campaigns/trigger", json=_trigger(tenant), headers=tenant.auth(role))
    assert created.status_code == 200, created.text
    request_id = created.json()["request_id"]
    cancelled = http.put(f"/api/campaigns/request/{request_id}/cancel", headers=tenant.auth(role))
    assert cancelled.status_code == 200, cancelled.text


def test_a_viewer_may_list_and_read_reports_but_not_send(
    http: httpx.Client, tenant: Tenant
) -> None:
    created = http.post("/api/campaigns/trigger", json=_trigger(tenant), headers=tenant.auth())
    request_id = created.json()["request_id"]
    viewer = tenant.auth(Role.viewer)
    refused = http.post("/api/campaigns/trigger", json=_trigger(tenant), headers=viewer)
    assert refused.status_code == 403
    assert refused.json() == {"error_message": "The role viewer may not send or cancel requests"}
    cancel = http.put(f"/api/campaigns/request/{request_id}/cancel", headers=viewer)
    assert cancel.status_code == 403
    listed = http.get(f"/api/campaigns/{tenant.started}/request/scheduled", headers=viewer)
    assert listed.status_code == 200
    assert [r["request_id"] for r in listed.json()["requests"]] == [request_id]
    report = http.get("/api/campaigns/report", params={"request_id": request_id}, headers=viewer)
    assert report.status_code == 400
    assert report.json() == {"error_message": "Request not processed yet"}


# --- quota ---------------------------------------------------------------------------


def test_quota_counts_every_call_and_then_answers_429(
    http: httpx.Client, tenant_factory: Callable[..., Tenant]
) -> None:
    tenant = tenant_factory(quota=5)
    auth = tenant.auth()
    calls: list[Callable[[], httpx.Response]] = [
        lambda: http.post("/api/campaigns/trigger", json=_trigger(tenant), headers=auth),
        lambda: http.post("/api/campaigns/trigger", json={"campaign_id": ""}, headers=auth),
        lambda: http.get(f"/api/campaigns/{tenant.started}/request/scheduled", headers=auth),
        lambda: http.get("/api/campaigns/report", params={"request_id": "x"}, headers=auth),
        lambda: http.put("/api/campaigns/request/x/cancel", headers=auth),
    ]
    statuses = []
    for expected_remaining, call in zip([4, 3, 2, 1, 0], calls, strict=True):
        response = call()
        statuses.append(response.status_code)
        assert response.headers["x-quota-remaining"] == str(expected_remaining)
    assert statuses == [200, 400, 200, 400, 400]
    spent = http.get(f"/api/campaigns/{tenant.started}/request/scheduled", headers=auth)
    assert spent.status_code == 429
    assert spent.json() == {
        "error_message": "The API Trigger request quota is spent for this period"
    }
    assert spent.headers["x-quota-remaining"] == "0"
    now = datetime.now(UTC)
    next_month = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1, tzinfo=UTC)
    retry_after = int(spent.headers["retry-after"])
    assert abs(retry_after - (next_month - now).total_seconds()) < 60
    # the viewer of the same organisation shares the quota; sign-in still works
    assert (
        http.get(
            f"/api/campaigns/{tenant.started}/request/scheduled", headers=tenant.auth(Role.viewer)
        ).status_code
        == 429
    )
    assert (
        http.post(
            "/users/sign_in",
            json={"user": {"email": tenant.emails[Role.member], "password": PASSWORD}},
        ).status_code
        == 200
    )


def test_daily_quota_retry_after_is_the_end_of_the_day(
    http: httpx.Client, tenant_factory: Callable[..., Tenant]
) -> None:
    tenant = tenant_factory(quota=0, quota_period="daily")
    response = http.put("/api/campaigns/request/x/cancel", headers=tenant.auth())
    assert response.status_code == 429
    now = datetime.now(UTC)
    tomorrow = datetime(now.year, now.month, now.day, tzinfo=UTC) + timedelta(days=1)
    assert abs(int(response.headers["retry-after"]) - (tomorrow - now).total_seconds()) < 60


async def test_quota_is_exact_under_concurrency(
    api_server: Server, tenant_factory: Callable[..., Tenant]
) -> None:
    tenant = tenant_factory(quota=40)
    limits = httpx.Limits(max_connections=30)
    async with httpx.AsyncClient(base_url=api_server.url, timeout=60, limits=limits) as client:
        responses = await asyncio.gather(
            *[
                client.get(f"/api/campaigns/nope-{i}/request/scheduled", headers=tenant.auth())
                for i in range(70)
            ]
        )
    statuses = [r.status_code for r in responses]
    assert statuses.count(400) == 40
    assert statuses.count(429) == 30
    remaining = sorted(
        int(r.headers["x-quota-remaining"]) for r in responses if r.status_code == 400
    )
    assert remaining == list(range(40))
    with session_scope() as session:
        usages = session.exec(
            __import__("sqlmodel").select(QuotaUsage).where(QuotaUsage.org_id == tenant.org_id)
        ).all()
        assert [u.used for u in usages] == [40]


# --- isolation -----------------------------------------------------------------------


def test_another_organisation_sees_nothing(
    http: httpx.Client, tenant: Tenant, other_tenant: Tenant
) -> None:
    created = http.post("/api/campaigns/trigger", json=_trigger(tenant), headers=tenant.auth())
    request_id = created.json()["request_id"]
    intruder = other_tenant.auth(Role.owner)

    trigger = http.post(
        "/api/campaigns/trigger", json=_trigger(other_tenant, tenant.started), headers=intruder
    )
    assert trigger.status_code == 400
    assert trigger.json() == {"error_message": f"Unknown campaign with identifier {tenant.started}"}
    csv = http.post(
        "/api/campaigns/trigger",
        headers=intruder,
        files={
            "campaign_id": (None, tenant.started),
            "file": ("u.csv", b"User,first_name,code\nu,a,b\n", "text/csv"),
        },
    )
    assert csv.json() == {"error_message": f"Unknown campaign with identifier {tenant.started}"}
    listed = http.get(f"/api/campaigns/{tenant.started}/request/scheduled", headers=intruder)
    assert listed.status_code == 400
    assert listed.json() == {
        "error_message": f"Campaign with identifier {tenant.started} was not found"
    }
    cancel = http.put(f"/api/campaigns/request/{request_id}/cancel", headers=intruder)
    assert cancel.status_code == 400
    assert cancel.json() == {"error_message": f"The request {request_id} was not found"}
    report = http.get("/api/campaigns/report", params={"request_id": request_id}, headers=intruder)
    assert report.json() == {"error_message": f"The request {request_id} was not found"}
    # ... and the owner's request is untouched
    listed = http.get(f"/api/campaigns/{tenant.started}/request/scheduled", headers=tenant.auth())
    assert [r["request_id"] for r in listed.json()["requests"]] == [request_id]
