"""The client's requests and its reading of answers, against httpx.MockTransport."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import httpx
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
    ServerError,
    TriggerAPIError,
    TriggerClient,
)


class Recorder:
    """A fake server: records the requests it got and answers with ``reply``."""

    def __init__(self, reply: httpx.Response | None = None) -> None:
        self.requests: list[httpx.Request] = []
        self.bodies: list[bytes] = []
        self.reply = reply or httpx.Response(200, json={"request_id": "r-1"})

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        self.bodies.append(request.read())
        return self.reply


def test_sign_in_keeps_the_token_from_the_authorization_header() -> None:
    server = Recorder(httpx.Response(200, headers={"Authorization": "Bearer abc"}, json={}))
    with TriggerClient("http://api", transport=httpx.MockTransport(server)) as api:
        assert api.sign_in("a@b.c", "pw") == "Bearer abc"
        assert json.loads(server.bodies[0]) == {"user": {"email": "a@b.c", "password": "pw"}}
        assert "authorization" not in server.requests[0].headers
        server.reply = httpx.Response(200, json={"request_id": "r-9"})
        api.create("c-1", messages=[Message(user_id="u")])
        assert server.requests[1].headers["Authorization"] == "Bearer abc"


def test_create_sends_the_json_method_with_send_at_and_idempotency_key() -> None:
    server = Recorder()
    when = datetime(2030, 1, 2, 9, 30, 15, 123456, tzinfo=timezone(timedelta(hours=1)))
    with TriggerClient(
        "http://api", token="Bearer t", transport=httpx.MockTransport(server)
    ) as api:
        created = api.create(
            "c-1",
            messages=[Message(user_id="u1", template_variables={"a": "1"}), {"user_id": "u2"}],
            send_at=when,
            idempotency_key="k-1",
        )
    assert created.request_id == "r-1"
    request = server.requests[0]
    assert (request.method, request.url.path) == ("POST", "/api/campaigns/trigger")
    assert request.headers["Idempotency-Key"] == "k-1"
    assert json.loads(server.bodies[0]) == {
        "campaign_id": "c-1",
        "send_at": "2030-01-02T09:30:15+01:00",
        "messages": [
            {"user_id": "u1", "template_variables": {"a": "1"}},
            {"user_id": "u2"},
        ],
    }


class StreamCheckingTransport(httpx.MockTransport):
    """MockTransport reads the body before its handler sees it: look at it first."""

    def __init__(self, server: Recorder) -> None:
        super().__init__(server)
        self.body_types: list[type[object]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.body_types.append(type(request.stream))
        return super().handle_request(request)


def test_create_streams_a_csv_file_as_multipart(tmp_path: Path) -> None:
    csv_file = tmp_path / "batch.csv"
    csv_file.write_text("User,first_name\nu1,Ada\n", encoding="utf-8")
    server = Recorder()
    transport = StreamCheckingTransport(server)
    with TriggerClient("http://api", token="Bearer t", transport=transport) as api:
        api.create("c-1", csv_path=csv_file)
    assert transport.body_types == [httpx._multipart.MultipartStream]  # streamed, not in memory
    request = server.requests[0]
    assert request.headers["Content-Type"].startswith("multipart/form-data")
    body = server.bodies[0]
    assert b'name="campaign_id"\r\n\r\nc-1' in body
    assert b'name="file"; filename="batch.csv"' in body
    assert b"User,first_name\nu1,Ada\n" in body
    assert b'name="send_at"' not in body


def test_create_needs_exactly_one_of_messages_and_csv(tmp_path: Path) -> None:
    with TriggerClient("http://api", transport=httpx.MockTransport(Recorder())) as api:
        with pytest.raises(ValueError, match="exactly one"):
            api.create("c-1")
        with pytest.raises(ValueError, match="exactly one"):
            api.create("c-1", messages=[], csv_path=tmp_path / "x.csv")
        with pytest.raises(ValueError, match="timezone"):
            api.create("c-1", messages=[], send_at=datetime(2030, 1, 1))


def test_scheduled_reads_a_page_with_its_total() -> None:
    server = Recorder(
        httpx.Response(
            200,
            headers={"X-Total-Count": "3"},
            json={
                "campaign_id": "c 1",
                "requests": [
                    {
                        "request_id": "r1",
                        "requested_at": 1_900_000_000,
                        "to_be_send_at": 1_900_000_600,
                        "messages": [{"user_id": "u", "template_variables": {}}],
                    },
                    {
                        "request_id": "r2",
                        "requested_at": 1_900_000_000,
                        "to_be_send_at": 1_900_000_600,
                        "messages": "http://api/files/x",
                    },
                ],
            },
        )
    )
    with TriggerClient(
        "http://api", token="Bearer t", transport=httpx.MockTransport(server)
    ) as api:
        page = api.scheduled("c 1", limit=2, offset=1)
    assert (
        server.requests[0].url.raw_path
        == b"/api/campaigns/c%201/request/scheduled?limit=2&offset=1"
    )
    assert page.total == 3
    assert [r.request_id for r in page.requests] == ["r1", "r2"]
    assert page.requests[0].campaign_id == "c 1"
    assert page.requests[0].to_be_send_at == datetime.fromtimestamp(1_900_000_600, UTC)
    assert page.requests[0].messages_url is None
    assert page.requests[1].messages_url == "http://api/files/x"


def test_cancel_accepts_the_spec_sample_spelling_of_messages() -> None:
    server = Recorder(
        httpx.Response(
            200,
            json={
                "request_id": "r1",
                "campaign_id": "c",
                "requested_at": 1,
                "to_be_send_at": 2,
                "Messages": [{"user_id": "u"}],
            },
        )
    )
    with TriggerClient(
        "http://api", token="Bearer t", transport=httpx.MockTransport(server)
    ) as api:
        info = api.cancel("r1")
    assert (server.requests[0].method, server.requests[0].url.path) == (
        "PUT",
        "/api/campaigns/request/r1/cancel",
    )
    assert info.messages == [Message(user_id="u")]


@pytest.mark.parametrize(
    ("status", "kind"),
    [
        (400, BadRequest),
        (401, AuthError),
        (403, ForbiddenError),
        (409, ConflictError),
        (413, PayloadTooLargeError),
        (429, QuotaError),
        (500, ServerError),
        (503, ServerError),
        (404, TriggerAPIError),
    ],
)
def test_every_refusal_raises_its_exception_with_the_message(
    status: int, kind: type[TriggerAPIError]
) -> None:
    reply = httpx.Response(status, json={"error_message": "nope"}, headers={"Retry-After": "42"})
    api = TriggerClient("http://api", transport=httpx.MockTransport(Recorder(reply)))
    with api, pytest.raises(kind) as caught:
        api.report("r1")
    assert type(caught.value) is kind
    assert (caught.value.error_message, caught.value.status_code) == ("nope", status)
    if isinstance(caught.value, QuotaError):
        assert caught.value.retry_after == 42


def test_an_answer_without_a_json_body_still_raises_with_its_text() -> None:
    reply = httpx.Response(502, text="Bad gateway")
    api = TriggerClient("http://api", transport=httpx.MockTransport(Recorder(reply)))
    with api, pytest.raises(ServerError, match="Bad gateway"):
        api.report("r1")


def test_download_does_not_send_the_token() -> None:
    server = Recorder(httpx.Response(200, text="app_id,campaign_id\nx,y\n"))
    with (
        TriggerClient("http://api", token="Bearer t", transport=httpx.MockTransport(server)) as api,
        api.download("http://files/reports/r1/a.csv?sig=1") as response,
    ):
        lines = list(response.iter_lines())
    assert lines == ["app_id,campaign_id", "x,y"]
    assert "authorization" not in server.requests[0].headers


async def test_the_async_download_does_not_send_the_token() -> None:
    server = Recorder(httpx.Response(200, text="app_id,campaign_id\nx,y\n"))
    transport = httpx.MockTransport(server)
    async with (
        AsyncTriggerClient("http://api", token="Bearer t", transport=transport) as api,
        api.download("http://files/reports/r1/a.csv?sig=1") as response,
    ):
        lines = [line async for line in response.aiter_lines()]
    assert lines == ["app_id,campaign_id", "x,y"]
    assert "authorization" not in server.requests[0].headers
    assert api.token == "Bearer t"  # still sent to the API


async def test_an_async_download_refused_raises_with_the_answer() -> None:
    server = Recorder(httpx.Response(403, json={"error_message": "Link expired"}))
    async with AsyncTriggerClient("http://api", transport=httpx.MockTransport(server)) as api:
        with pytest.raises(ForbiddenError, match="Link expired"):
            async with api.download("http://files/reports/r1/a.csv?sig=1"):
                pytest.fail("a refused download yields nothing")


async def test_the_async_client_makes_the_same_calls(tmp_path: Path) -> None:
    csv_file = tmp_path / "batch.csv"
    csv_file.write_text("User\nu1\n", encoding="utf-8")
    server = Recorder(
        httpx.Response(
            200,
            headers={"Authorization": "Bearer z"},
            json={"request_id": "r-5", "reports": ["l1"]},
        )
    )
    async with AsyncTriggerClient("http://api", transport=httpx.MockTransport(server)) as api:
        assert await api.sign_in("a@b.c", "pw") == "Bearer z"
        assert (await api.create("c", csv_path=csv_file)).request_id == "r-5"
        assert (await api.report("r-5")).reports == ["l1"]
        await api.sign_out()
        assert api.token is None
        server.reply = httpx.Response(401, json={"error_message": "Invalid token"})
        with pytest.raises(AuthError, match="Invalid token"):
            await api.report("r-5")
    assert b"User\nu1\n" in server.bodies[1]
    assert [r.method for r in server.requests] == ["POST", "POST", "GET", "DELETE", "GET"]
    assert server.requests[3].headers["Authorization"] == "Bearer z"
