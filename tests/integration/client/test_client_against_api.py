"""The Python client against the real HTTP API (a uvicorn subprocess), a delivery worker
and the sandbox providers: every method, and every error the API answers with."""

from __future__ import annotations

import asyncio
import csv
import io
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from campaign_trigger.client import (
    AsyncTriggerClient,
    AuthError,
    BadRequest,
    ConflictError,
    ForbiddenError,
    Message,
    PayloadTooLargeError,
    QuotaError,
    Report,
    TriggerClient,
)
from integration.client.running_stack import (
    RunningStack,
    SeededTenant,
    eventually,
    running_stack,
    seed_tenant,
    write_batch_csv,
)
from support import ManagedProcess

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MAX_UPLOAD = 200_000
REPORT_HEADER = [
    "app_id",
    "campaign_id",
    "user_id",
    "device_id",
    "sent_at",
    "request_id",
    "channel",
    "error_message",
]


@pytest.fixture(scope="module")
def stack(prefect_server: ManagedProcess, session_dir: Path) -> Iterator[RunningStack]:
    with running_stack(session_dir, extra_env={"CT_MAX_UPLOAD_BYTES": str(MAX_UPLOAD)}) as s:
        yield s


@pytest.fixture
def tenant() -> SeededTenant:
    return seed_tenant()


@pytest.fixture
def api(stack: RunningStack, tenant: SeededTenant) -> Iterator[TriggerClient]:
    with TriggerClient(stack.api_url) as client:
        client.sign_in(tenant.member_email, tenant.password)
        yield client


def messages_for(tenant: SeededTenant) -> list[Message]:
    return [
        Message(user_id=u, template_variables={"first_name": f"N{n}", "order_id": f"O{n}"})
        for n, u in enumerate(tenant.users)
    ]


def later(minutes: int = 60) -> datetime:
    return datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=minutes)


def wait_for_report(api: TriggerClient, request_id: str) -> Report:
    def processed() -> Report:
        try:
            return api.report(request_id)
        except BadRequest as exc:
            if exc.error_message != "Request not processed yet":
                raise
            raise AssertionError("not processed yet") from exc

    return eventually(processed, timeout=90)


def test_sign_in_returns_a_bearer_token_and_wrong_credentials_raise_auth_error(
    stack: RunningStack, tenant: SeededTenant
) -> None:
    with TriggerClient(stack.api_url) as client:
        token = client.sign_in(tenant.member_email, tenant.password)
        assert token.startswith("Bearer ")
        assert client.token == token
        with pytest.raises(AuthError) as caught:
            client.sign_in(tenant.member_email, "not the password")
        assert caught.value.status_code == 401
        assert caught.value.error_message


def test_a_json_batch_is_delivered_and_its_report_downloads(
    api: TriggerClient, tenant: SeededTenant, stack: RunningStack
) -> None:
    created = api.create(tenant.campaign_id, messages=messages_for(tenant))
    report = wait_for_report(api, created.request_id)
    assert report.request_id == created.request_id
    assert len(report.reports) == 1  # one file per app
    with api.download(report.reports[0]) as response:
        rows = list(csv.reader(io.StringIO(response.read().decode())))
    assert rows[0] == REPORT_HEADER
    assert sorted(row[2] for row in rows[1:]) == sorted(tenant.users)
    assert {row[7] for row in rows[1:]} == {""}  # every message sent
    assert {row[5] for row in rows[1:]} == {created.request_id}


def test_a_csv_batch_is_listed_while_scheduled_and_cancelled(
    api: TriggerClient, tenant: SeededTenant, tmp_path: Path
) -> None:
    batch = write_batch_csv(tmp_path / "batch.csv", tenant.users)
    when = later()
    created = api.create(tenant.campaign_id, csv_path=batch, send_at=when)
    page = api.scheduled(tenant.campaign_id)
    assert [r.request_id for r in page.requests] == [created.request_id]
    assert page.total == 1
    listed = page.requests[0]
    assert listed.to_be_send_at == when
    assert listed.messages_url is not None
    with api.download(listed.messages_url) as response:
        assert response.read().decode().splitlines()[0] == "User,first_name,order_id"

    cancelled = api.cancel(created.request_id)
    assert (cancelled.request_id, cancelled.campaign_id) == (created.request_id, tenant.campaign_id)
    assert cancelled.to_be_send_at == when
    assert api.scheduled(tenant.campaign_id).requests == []
    with pytest.raises(BadRequest, match="Request already canceled"):
        api.cancel(created.request_id)


def test_scheduled_pages_with_limit_and_offset(api: TriggerClient, tenant: SeededTenant) -> None:
    ids = [
        api.create(
            tenant.campaign_id, messages=messages_for(tenant), send_at=later(10 + n)
        ).request_id
        for n in range(3)
    ]
    first = api.scheduled(tenant.campaign_id, limit=2)
    second = api.scheduled(tenant.campaign_id, limit=2, offset=2)
    assert (first.total, second.total) == (3, 3)
    assert [r.request_id for r in first.requests + second.requests] == ids
    assert first.requests[0].messages == messages_for(tenant)
    api.cancel(ids[0])  # an offset of 2 now skips ids[2]; the page after ids[1] does not
    following = api.scheduled(tenant.campaign_id, limit=2, after=first.requests[-1].request_id)
    assert ([r.request_id for r in following.requests], following.total) == (ids[2:], 2)
    for request_id in ids[1:]:
        api.cancel(request_id)


def test_the_spec_refusals_raise_bad_request_with_their_message(
    api: TriggerClient, tenant: SeededTenant, tmp_path: Path
) -> None:
    refusals: dict[str, Callable[[], object]] = {
        "Unknown campaign with identifier nope": lambda: api.create(
            "nope", messages=messages_for(tenant)
        ),
        "Invalid file : missing variables : (order_id)": lambda: api.create(
            tenant.campaign_id,
            messages=[Message(user_id="u", template_variables={"first_name": "x"})],
        ),
        "The delivery time is in the past, please change it": lambda: api.create(
            tenant.campaign_id, messages=messages_for(tenant), send_at=later(-60)
        ),
        "Invalid time format": lambda: api.create(
            tenant.campaign_id, messages=messages_for(tenant), send_at="tomorrow"
        ),
        "Invalid file : 'User' column is missing": lambda: api.create(
            tenant.campaign_id, csv_path=_write(tmp_path / "x.csv", "Who,first_name\n")
        ),
        "The request r-unknown was not found": lambda: api.report("r-unknown"),
        "Campaign with identifier nope was not found": lambda: api.scheduled("nope"),
        "The request r-gone was not found": lambda: api.scheduled(
            tenant.campaign_id, after="r-gone"
        ),
        "You must provide a request_id": lambda: api.scheduled(tenant.campaign_id, after=" "),
        "Invalid query parameter 'after': String should have at most 64 characters": (
            lambda: api.scheduled(tenant.campaign_id, after="r" * 65)
        ),
    }
    for message, call in refusals.items():
        with pytest.raises(BadRequest) as caught:
            call()
        assert (caught.value.status_code, caught.value.error_message) == (400, message)


def test_report_and_cancel_refusals_follow_the_request_state(
    api: TriggerClient, tenant: SeededTenant
) -> None:
    scheduled = api.create(tenant.campaign_id, messages=messages_for(tenant), send_at=later())
    with pytest.raises(BadRequest, match="Request not processed yet"):
        api.report(scheduled.request_id)
    api.cancel(scheduled.request_id)

    sent = api.create(tenant.campaign_id, messages=messages_for(tenant))
    wait_for_report(api, sent.request_id)
    with pytest.raises(BadRequest, match="Request can't be canceled"):
        api.cancel(sent.request_id)


def test_a_viewer_may_read_but_not_send(stack: RunningStack, tenant: SeededTenant) -> None:
    with TriggerClient(stack.api_url) as viewer:
        viewer.sign_in(tenant.viewer_email, tenant.password)
        assert viewer.scheduled(tenant.campaign_id).requests == []
        with pytest.raises(ForbiddenError) as caught:
            viewer.create(tenant.campaign_id, messages=messages_for(tenant))
    assert caught.value.status_code == 403


def test_a_spent_quota_raises_quota_error_with_retry_after(stack: RunningStack) -> None:
    tenant = seed_tenant(quota=1)
    with TriggerClient(stack.api_url) as client:
        client.sign_in(tenant.member_email, tenant.password)
        client.scheduled(tenant.campaign_id)
        with pytest.raises(QuotaError) as caught:
            client.scheduled(tenant.campaign_id)
    assert caught.value.status_code == 429
    assert caught.value.retry_after is not None
    assert caught.value.retry_after > 0


def test_an_idempotency_key_replays_and_a_reused_one_conflicts(
    api: TriggerClient, tenant: SeededTenant
) -> None:
    when = later()
    first = api.create(
        tenant.campaign_id,
        messages=messages_for(tenant),
        send_at=when,
        idempotency_key="order-batch-1",
    )
    again = api.create(
        tenant.campaign_id,
        messages=messages_for(tenant),
        send_at=when,
        idempotency_key="order-batch-1",
    )
    assert again.request_id == first.request_id
    with pytest.raises(ConflictError) as caught:
        api.create(
            tenant.campaign_id,
            messages=messages_for(tenant)[:1],
            send_at=when,
            idempotency_key="order-batch-1",
        )
    assert caught.value.status_code == 409
    api.cancel(first.request_id)


def test_an_upload_over_the_limit_raises_payload_too_large(
    api: TriggerClient, tenant: SeededTenant, tmp_path: Path
) -> None:
    big = tmp_path / "big.csv"
    with big.open("w") as handle:
        handle.write("User,first_name,order_id\n")
        row = 0
        while handle.tell() <= MAX_UPLOAD:
            handle.write(f"user-{row},Name,Order-{row}\n")
            row += 1
    with pytest.raises(PayloadTooLargeError) as caught:
        api.create(tenant.campaign_id, csv_path=big)
    assert caught.value.status_code == 413


def test_sign_out_revokes_the_token(stack: RunningStack, tenant: SeededTenant) -> None:
    with TriggerClient(stack.api_url) as client:
        token = client.sign_in(tenant.member_email, tenant.password)
        client.sign_out()
        assert client.token is None
        with pytest.raises(AuthError):
            client.scheduled(tenant.campaign_id)
        client.token = token  # the revoked token itself is refused too
        with pytest.raises(AuthError) as caught:
            client.scheduled(tenant.campaign_id)
    assert caught.value.status_code == 401


async def test_the_async_client_sends_lists_cancels_and_reports(
    stack: RunningStack, tenant: SeededTenant, tmp_path: Path
) -> None:
    batch = write_batch_csv(tmp_path / "batch.csv", tenant.users)
    async with AsyncTriggerClient(stack.api_url) as api:
        await api.sign_in(tenant.member_email, tenant.password)
        scheduled = await api.create(tenant.campaign_id, csv_path=batch, send_at=later())
        page = await api.scheduled(tenant.campaign_id, limit=10)
        assert [r.request_id for r in page.requests] == [scheduled.request_id]
        assert (await api.cancel(scheduled.request_id)).request_id == scheduled.request_id
        sent = await api.create(tenant.campaign_id, messages=messages_for(tenant))
        with pytest.raises(BadRequest, match="The request nope was not found"):
            await api.report("nope")
        for _ in range(180):
            try:
                report = await api.report(sent.request_id)
                break
            except BadRequest:
                await asyncio.sleep(0.5)
        else:
            pytest.fail("the request was not processed in 90 s")
        assert len(report.reports) == 1
        async with api.download(report.reports[0]) as response:
            rows = list(csv.reader([line async for line in response.aiter_lines()]))
        assert rows[0] == REPORT_HEADER
        assert sorted(row[2] for row in rows[1:]) == sorted(tenant.users)
        await api.sign_out()


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
