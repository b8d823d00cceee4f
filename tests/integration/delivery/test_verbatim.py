"""Exactly what was written: the provider receives the template filled with the exact
text of each value, for CSV uploads and JSON messages alike (property tests).

Requests are created by ``create_request`` (the service behind the API: upload
writer, CSV ingest or JSON checks, message file) and delivered by the delivery
service to the real sandbox, whose recorded payloads are compared with the template.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import uuid
from datetime import UTC, datetime
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from campaign_trigger.config import Settings
from campaign_trigger.delivery.sandbox_rules import SandboxState
from campaign_trigger.services import delivering, delivery_run, json_text, message_file
from campaign_trigger.services.trigger_input import TriggerInput
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import get_storage, messages_key
from delivery_support import (
    BODY,
    TITLE,
    DeviceSpec,
    Tenant,
    _create,
    add_csv_request,
    add_devices,
    seed_tenant,
)

# Any text but lone surrogates and control characters other than tab and line breaks
# (a file dense in those is refused as binary by the upload sniffer, by design).
_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")) | st.sampled_from("\t\n\r"),
    max_size=40,
)
_JSON_NUMBER = st.from_regex(
    r"-?(0|[1-9][0-9]{0,15})(\.[0-9]{1,8})?([eE][+-]?[0-9]{1,2})?", fullmatch=True
)
_EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _expected(first_name: str, order_id: str) -> tuple[str, str]:
    return (
        TITLE.replace("{{ first_name }}", first_name),
        BODY.replace("{{ order_id }}", order_id),
    )


def _audience(tenant: Tenant, count: int) -> list[str]:
    """``count`` fresh users, each with an Android and an iOS device."""
    tag = uuid.uuid4().hex[:8]
    users = [f"v-{tag}-{n}" for n in range(count)]
    add_devices(
        [DeviceSpec(tenant.android, f"{u}-a", u, f"tok-{u}-a") for u in users]
        + [DeviceSpec(tenant.ios, f"{u}-i", u, f"tok-{u}-i") for u in users]
    )
    return users


def _deliver(settings: Settings, request_id: str) -> None:
    """What the delivery tasks do, without Prefect: plan, then each chunk."""
    storage = get_storage(settings)
    with session_scope() as session:
        plan = delivery_run.start_delivery(
            session=session, settings=settings, request_id=request_id
        )
        for chunk_no in range(plan.chunk_count):
            chunk = message_file.read_chunk(
                storage=storage, key=messages_key(request_id), chunk_no=chunk_no
            )
            job = plan.job(chunk_no)
            asyncio.run(
                delivering.process_chunk(session=session, settings=settings, job=job, chunk=chunk)
            )


def _received(state: SandboxState, user: str) -> set[tuple[str, str]]:
    """(title, body) the sandbox accepted for the user's two devices."""
    return {
        (d["title"], d["body"])
        for token in (f"tok-{user}-a", f"tok-{user}-i")
        for d in state.deliveries_for(token)
    }


@_EXAMPLES
@given(values=st.lists(st.tuples(_TEXT, _TEXT), min_size=1, max_size=8))
def test_a_csv_upload_is_delivered_with_its_exact_strings(
    settings: Settings, sandbox_state: SandboxState, values: list[tuple[str, str]]
) -> None:
    tenant = seed_tenant()
    users = _audience(tenant, len(values))
    rows = [
        {"User": user, "first_name": first, "order_id": order}
        for user, (first, order) in zip(users, values, strict=True)
    ]
    request_id = add_csv_request(tenant, rows, send_at=datetime.now(UTC), chunk_size=3)
    _deliver(settings, request_id)
    for user, (first, order) in zip(users, values, strict=True):
        assert _received(sandbox_state, user) == {_expected(first, order)}


_JSON_VALUE = st.one_of(
    _TEXT.map(lambda text: (json.dumps(text), text)),
    _JSON_NUMBER.map(lambda number: (number, number)),
    st.booleans().map(lambda flag: ("true", "true") if flag else ("false", "false")),
    st.just(("null", "")),
)


@_EXAMPLES
@given(values=st.lists(st.tuples(_JSON_VALUE, _JSON_VALUE), min_size=1, max_size=8))
def test_json_messages_are_delivered_with_the_text_of_each_value(
    settings: Settings,
    sandbox_state: SandboxState,
    values: list[tuple[tuple[str, str], tuple[str, str]]],
) -> None:
    """Strings verbatim, numbers as written in the body, booleans as true/false, null empty."""
    tenant = seed_tenant()
    users = _audience(tenant, len(values))
    members = [
        f'{{"user_id": {json.dumps(user)}, "template_variables": '
        f'{{"first_name": {first[0]}, "order_id": {order[0]}}}}}'
        for user, (first, order) in zip(users, values, strict=True)
    ]
    body: Any = json_text.loads(f'{{"messages": [{", ".join(members)}]}}')  # as the API does
    trigger = TriggerInput(campaign_id=tenant.campaign_id, messages=body["messages"])
    request_id = _create(tenant, trigger, chunk_size=3)
    _deliver(settings, request_id)
    for user, (first, order) in zip(users, values, strict=True):
        assert _received(sandbox_state, user) == {_expected(first[1], order[1])}


def test_a_value_holding_a_placeholder_is_not_rendered_again(
    settings: Settings, sandbox_state: SandboxState
) -> None:
    tenant = seed_tenant()
    [user] = _audience(tenant, 1)
    rows = [{"User": user, "first_name": "{{ order_id }}", "order_id": "{{first_name}}"}]
    request_id = add_csv_request(tenant, rows, send_at=datetime.now(UTC))
    _deliver(settings, request_id)
    assert _received(sandbox_state, user) == {_expected("{{ order_id }}", "{{first_name}}")}


def test_the_values_of_the_issue_arrive_unchanged(
    settings: Settings, sandbox_state: SandboxState
) -> None:
    """The reported cases: leading zeros, trailing zeros, null markers, booleans, exponents."""
    cases = ["007", "2.00", "NA", "null", "None", "nan", "TRUE", "false", "1e3", " x ", ""]
    tenant = seed_tenant()
    users = _audience(tenant, len(cases))
    text = io.StringIO(newline="")
    writer = csv.writer(text)
    writer.writerow(["User", "first_name", "order_id"])
    writer.writerows([user, case, case] for user, case in zip(users, cases, strict=True))
    rows = list(csv.DictReader(io.StringIO(text.getvalue())))
    request_id = add_csv_request(tenant, rows, send_at=datetime.now(UTC))
    _deliver(settings, request_id)
    for user, case in zip(users, cases, strict=True):
        assert _received(sandbox_state, user) == {_expected(case, case)}
