"""Schemathesis over the OpenAPI page, against the real server: more than 1,000 generated
calls (valid and invalid data) find no 5xx and no answer outside the documented schema."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import pytest
import requests
import schemathesis
from api_tenants import PASSWORD, Server, Tenant, make_tenant
from hypothesis import HealthCheck, given, settings
from hypothesis.strategies import SearchStrategy
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.result import Ok
from sqlmodel import select

from campaign_trigger.config import get_settings
from campaign_trigger.services.auth import issue_token
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.models import Account, Role

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]
EXAMPLES_PER_MODE = 50
WEBHOOKS = "/api/webhooks"
WEBHOOK_EXAMPLES_PER_MODE = 25  # four routes beyond the spec, called as an owner
MINIMUM_CASES = 1000


def _seed_requests(base_url: str, tenant: Tenant) -> None:
    """A JSON and a CSV request, so that the scheduled list has both shapes to show."""
    body = {
        "campaign_id": tenant.started,
        "messages": [{"user_id": "u1", "template_variables": {"first_name": "A", "code": "1"}}],
    }
    url = f"{base_url}/api/campaigns/trigger"
    assert requests.post(url, json=body, headers=tenant.auth(), timeout=30).status_code == 200
    files: dict[str, tuple[str | None, str] | tuple[str, bytes, str]] = {
        "campaign_id": (None, tenant.plain),
        "file": ("u.csv", b"User\nu1\n", "text/csv"),
    }
    csv = requests.post(url, headers=tenant.auth(), timeout=30, files=files)
    assert csv.status_code == 200


def _strategies(
    operation: schemathesis.APIOperation[Any, Any, Any, Any], tenant: Tenant
) -> list[tuple[SearchStrategy[schemathesis.Case[Any]], int]]:
    """Valid and invalid data for every operation, plus a few calls that must succeed."""
    examples = (
        WEBHOOK_EXAMPLES_PER_MODE if operation.path.startswith(WEBHOOKS) else EXAMPLES_PER_MODE
    )
    strategies = [
        (operation.as_strategy(generation_mode=mode), examples)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    ]
    if operation.path == "/api/campaigns/{campaign_id}/request/scheduled":
        known = operation.as_strategy(path_parameters={"campaign_id": tenant.started})
        strategies.append((known, 5))
    if operation.path.startswith("/users/sign_in"):
        good = {"user": {"email": tenant.emails[Role.viewer], "password": PASSWORD}}
        strategies.append((operation.as_strategy(body=good), 5))
    return strategies


@pytest.mark.slow
def test_generated_calls_stay_within_the_documented_schema(api_server: Server) -> None:
    tenant = make_tenant(quota=1_000_000)
    schema = schemathesis.openapi.from_url(f"{api_server.url}/openapi.json")
    headers = tenant.auth()

    def fresh_token() -> dict[str, str]:
        with session_scope() as db:
            account = db.exec(
                select(Account).where(Account.email == tenant.emails[Role.member])
            ).one()
            return {
                "Authorization": f"Bearer {issue_token(settings=get_settings(), account=account)}"
            }

    calls: Counter[str] = Counter()
    statuses: Counter[int] = Counter()
    _seed_requests(api_server.url, tenant)
    started = time.monotonic()
    with requests.Session() as session:
        for result in schema.get_all_operations():
            assert isinstance(result, Ok), result
            operation = result.ok()
            if operation.path in ("/health", "/metrics"):  # no input to generate
                continue
            for strategy, examples in _strategies(operation, tenant):

                @given(case=strategy)
                @settings(
                    max_examples=examples,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                )
                def run(case: schemathesis.Case[Any]) -> None:
                    # signing out revokes the token used: give that call a token of its own
                    auth = fresh_token() if case.operation.path == "/users/sign_out" else headers
                    if case.operation.path.startswith(WEBHOOKS):
                        auth = tenant.auth(Role.owner)  # members may not: reach the service
                    response = case.call_and_validate(
                        base_url=api_server.url,
                        session=session,
                        headers=auth,
                        checks=CHECKS,
                        timeout=30,
                    )
                    calls[case.operation.label] += 1
                    statuses[response.status_code] += 1

                run()
    elapsed = time.monotonic() - started
    total = sum(calls.values())
    print(f"{total} generated calls in {elapsed:.0f}s: {dict(calls)}; statuses {dict(statuses)}")
    assert total >= MINIMUM_CASES, (total, calls)
    assert not any(status >= 500 for status in statuses), statuses
    assert elapsed < 150, elapsed
    assert statuses[200] > 0, statuses
    assert statuses[400] > 0, statuses
