"""The webhook routes through the real server: owners and admins register, list and
remove endpoints and read their attempts; other roles get 403; outside sandbox mode a
URL that is not https is a 400; errors in the contract's format."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from api_tenants import Server, Tenant

from campaign_trigger.store.models import Role

WEBHOOKS = "/api/webhooks"
BAD_URL = "The webhook URL must be an absolute URL with a host (ASCII, no spaces)"


@pytest.fixture
def api(api_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_server.url, timeout=30) as client:
        yield client


def _register(api: httpx.Client, tenant: Tenant, role: Role, url: str) -> httpx.Response:
    return api.post(WEBHOOKS, json={"url": url}, headers=tenant.auth(role))


@pytest.mark.parametrize("role", [Role.owner, Role.admin])
def test_an_owner_or_admin_registers_an_endpoint_and_sees_its_secret_once(
    api: httpx.Client, tenant: Tenant, role: Role
) -> None:
    created = _register(api, tenant, role, "https://hooks.example.com/ct")
    assert created.status_code == 200, created.text
    body = created.json()
    assert body["id"].startswith("whk_")
    assert body["secret"].startswith("whsec_")
    assert body["url"] == "https://hooks.example.com/ct"
    listed = api.get(WEBHOOKS, headers=tenant.auth(role))
    assert listed.status_code == 200, listed.text
    [shown] = listed.json()["webhooks"]
    assert shown == {k: body[k] for k in ("id", "url", "created_at")}  # no secret
    attempts = api.get(f"{WEBHOOKS}/{body['id']}/attempts", headers=tenant.auth(role))
    assert attempts.json() == {"attempts": []}


@pytest.mark.parametrize("role", [Role.member, Role.viewer])
def test_a_member_or_viewer_may_not_manage_webhooks(
    api: httpx.Client, tenant: Tenant, role: Role
) -> None:
    refused = _register(api, tenant, role, "https://hooks.example.com/ct")
    assert refused.status_code == 403
    assert refused.json() == {"error_message": f"The role {role.value} may not manage webhooks"}
    endpoint = _register(api, tenant, Role.owner, "https://hooks.example.com/ct").json()["id"]
    for answer in (
        api.get(WEBHOOKS, headers=tenant.auth(role)),
        api.get(f"{WEBHOOKS}/{endpoint}/attempts", headers=tenant.auth(role)),
        api.delete(f"{WEBHOOKS}/{endpoint}", headers=tenant.auth(role)),
    ):
        assert answer.status_code == 403, answer.text
    assert len(api.get(WEBHOOKS, headers=tenant.auth(Role.owner)).json()["webhooks"]) == 1


def test_without_a_token_the_routes_answer_401(api: httpx.Client) -> None:
    answer = api.post(WEBHOOKS, json={"url": "https://hooks.example.com/ct"})
    assert answer.status_code == 401
    assert set(answer.json()) == {"error_message"}


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("http://hooks.example.com/ct", "The webhook URL must be an https:// URL"),
        (
            "hooks.example.com",
            "The webhook URL must be an absolute URL with a host (ASCII, no spaces)",
        ),
        ("https://", "The webhook URL must be an absolute URL with a host (ASCII, no spaces)"),
        (
            "https://169.254.169.254/latest/meta-data",
            "The webhook URL must not point to a private, loopback, link-local or reserved address",
        ),
    ],
)
def test_a_url_that_is_not_https_is_refused_outside_sandbox_mode(
    api: httpx.Client, tenant: Tenant, url: str, message: str
) -> None:
    refused = _register(api, tenant, Role.owner, url)
    assert refused.status_code == 400
    assert refused.json() == {"error_message": message}


@pytest.mark.parametrize("body", [{}, {"url": 5}, {"url": ""}, [], "x"])
def test_a_malformed_body_is_a_400_in_the_contracts_format(
    api: httpx.Client, tenant: Tenant, body: object
) -> None:
    refused = api.post(WEBHOOKS, json=body, headers=tenant.auth(Role.owner))
    assert refused.status_code == 400, refused.text
    assert set(refused.json()) == {"error_message"}


def test_another_organisations_endpoint_is_answered_as_an_unknown_one(
    api: httpx.Client, tenant: Tenant, other_tenant: Tenant
) -> None:
    theirs = _register(api, other_tenant, Role.owner, "https://o.example.com").json()["id"]
    for endpoint in (theirs, "whk_unknown"):
        expected = {"error_message": f"The webhook {endpoint} was not found"}
        for answer in (
            api.delete(f"{WEBHOOKS}/{endpoint}", headers=tenant.auth(Role.owner)),
            api.get(f"{WEBHOOKS}/{endpoint}/attempts", headers=tenant.auth(Role.owner)),
        ):
            assert (answer.status_code, answer.json()) == (400, expected)
    assert api.get(WEBHOOKS, headers=tenant.auth(Role.owner)).json() == {"webhooks": []}


def test_a_removed_endpoint_is_no_longer_listed(api: httpx.Client, tenant: Tenant) -> None:
    endpoint = _register(api, tenant, Role.admin, "https://hooks.example.com/a").json()["id"]
    removed = api.delete(f"{WEBHOOKS}/{endpoint}", headers=tenant.auth(Role.owner))
    assert removed.status_code == 204
    assert api.get(WEBHOOKS, headers=tenant.auth(Role.owner)).json() == {"webhooks": []}


def test_the_openapi_page_documents_the_webhook_routes(api: httpx.Client) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    for path, method in [
        (WEBHOOKS, "post"),
        (WEBHOOKS, "get"),
        (f"{WEBHOOKS}/{{webhook_id}}", "delete"),
        (f"{WEBHOOKS}/{{webhook_id}}/attempts", "get"),
    ]:
        operation = paths[path][method]
        assert operation["description"], path
        assert "422" not in operation["responses"]
        assert {"400", "401", "403"} <= set(operation["responses"])
        for code in ("400", "401", "403"):
            schema = operation["responses"][code]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorBody"}
