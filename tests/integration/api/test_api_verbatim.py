"""JSON template variables through the real server: each value's text as the body wrote it
reaches the message file, and values with no text are refused with a 400."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from api_tenants import Server, Tenant

from campaign_trigger.config import get_settings
from campaign_trigger.services.message_file import USER_FIELD, read_chunk
from campaign_trigger.store.files import get_storage, messages_key

TRIGGER = "/api/campaigns/trigger"


def test_json_numbers_and_booleans_are_kept_as_written_through_the_server(
    api_server: Server, tenant: Tenant
) -> None:
    """The message file holds each value's text as the body wrote it."""
    body = (
        f'{{"campaign_id": "{tenant.started}", "messages": ['
        '{"user_id": "u1", "template_variables": {"first_name": 2.00, "code": 1e3}},'
        '{"user_id": "u2", "template_variables": {"first_name": true, "code": -0}},'
        '{"user_id": "u3", "template_variables": {"first_name": null, "code": "007"}}]}'
    )
    response = httpx.post(
        f"{api_server.url}{TRIGGER}",
        content=body,
        headers={**tenant.auth(), "Content-Type": "application/json"},
    )
    assert response.status_code == 200, response.text
    request_id = response.json()["request_id"]
    chunk = read_chunk(
        storage=get_storage(get_settings()), key=messages_key(request_id), chunk_no=0
    )
    assert chunk.to_pylist() == [
        {USER_FIELD: "u1", "first_name": "2.00", "code": "1e3"},
        {USER_FIELD: "u2", "first_name": "true", "code": "-0"},
        {USER_FIELD: "u3", "first_name": "", "code": "007"},
    ]


def test_the_scheduled_list_and_the_cancel_show_numbers_as_written(
    api_server: Server, tenant: Tenant
) -> None:
    """The echo of a JSON request is what the body wrote, as its delivery is."""
    later = (datetime.now(UTC) + timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = (
        f'{{"campaign_id": "{tenant.started}", "send_at": "{later}", "messages": ['
        '{"user_id": "u1", "template_variables": {"first_name": 2.00, "code": 1e3}},'
        '{"user_id": "u2", "template_variables": {"first_name": -0, "code": 1.50E+2}}]}'
    )
    headers = {**tenant.auth(), "Content-Type": "application/json"}
    response = httpx.post(f"{api_server.url}{TRIGGER}", content=body, headers=headers)
    assert response.status_code == 200, response.text
    request_id = response.json()["request_id"]
    written = [
        {"user_id": "u1", "template_variables": {"first_name": "2.00", "code": "1e3"}},
        {"user_id": "u2", "template_variables": {"first_name": "-0", "code": "1.50E+2"}},
    ]

    def as_written(text: str) -> Any:  # each number as its text
        return json.loads(text, parse_float=str, parse_int=str)

    listed = httpx.get(
        f"{api_server.url}/api/campaigns/{tenant.started}/request/scheduled", headers=headers
    )
    assert listed.status_code == 200, listed.text
    [entry] = [r for r in as_written(listed.text)["requests"] if r["request_id"] == request_id]
    assert entry["messages"] == written
    cancelled = httpx.put(
        f"{api_server.url}/api/campaigns/request/{request_id}/cancel", headers=headers
    )
    assert cancelled.status_code == 200, cancelled.text
    assert as_written(cancelled.text)["messages"] == written


def test_json_values_that_cannot_be_text_are_refused_through_the_server(
    api_server: Server, tenant: Tenant
) -> None:
    for variables, message in [
        ('{"first_name": 1e999, "code": "x"}', "must be strings or numbers"),
        ('{"first_name": "\\ud800", "code": "x"}', "must be valid Unicode text"),
        # refused in a CSV file (a NUL byte), and PostgreSQL text (an inbox entry) refuses it
        ('{"first_name": "a\\u0000b", "code": "x"}', "must not hold a NUL character"),
        ('{"first_name": NaN, "code": "x"}', "Malformed JSON body"),
    ]:
        body = (
            f'{{"campaign_id": "{tenant.started}", "messages": ['
            f'{{"user_id": "u1", "template_variables": {variables}}}]}}'
        )
        response = httpx.post(
            f"{api_server.url}{TRIGGER}",
            content=body,
            headers={**tenant.auth(), "Content-Type": "application/json"},
        )
        assert response.status_code == 400, (variables, response.text)
        assert message in response.json()["error_message"]
