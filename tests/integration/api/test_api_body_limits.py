"""Body limits through the real server: refused (413) while the body streams in, before
it is parsed and before the caller is authenticated; the API's memory stays flat for a
40 MB sign-in and a 3 MiB JSON create of ``{}``s (measured with psutil)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from api_devices import tenant_app
from api_memory import PeakRss
from api_tenants import PASSWORD, Server, Tenant, start_api_server

from campaign_trigger.api.limits import JSON_OVERHEAD_BYTES
from campaign_trigger.config import get_settings
from campaign_trigger.store.models import Role

MB = 1024 * 1024
FLAT = 16 * MB  # what the API may grow by while refusing a large body
TOO_LARGE = "The request body is larger than the {} bytes allowed"


@pytest.fixture(scope="module")
def server(session_dir: Path) -> Iterator[Server]:
    """An API process of its own, so that its memory is this module's doing."""
    started = start_api_server(session_dir)
    try:
        yield started
    finally:
        started.process.stop()


def _pieces(total: int, piece: bytes) -> Iterator[bytes]:
    """``total`` bytes of ``piece`` repeated, as a chunked body (no Content-Length)."""
    block = piece * (64 * 1024 // len(piece))
    sent = 0
    while sent < total:
        yield block
        sent += len(block)


def _warm(server: Server, tenant: Tenant) -> None:
    """One call of each kind, so that lazily imported code is already in memory."""
    login = {"user": {"email": tenant.emails[Role.member], "password": PASSWORD}}
    assert httpx.post(f"{server.url}/users/sign_in", json=login).status_code == 200
    body = {"campaign_id": tenant.plain, "messages": [{"user_id": "u"}]}
    created = httpx.post(f"{server.url}/api/campaigns/trigger", json=body, headers=tenant.auth())
    assert created.status_code == 200, created.text


def _sign_in_body(size: int) -> bytes:
    return b'{"user": {"email": "a@b.io", "password": "' + b"x" * size + b'"}}'


def test_a_40_mb_sign_in_is_refused_and_costs_no_memory(server: Server, tenant: Tenant) -> None:
    _warm(server, tenant)
    url = f"{server.url}/users/sign_in"
    headers = {"Content-Type": "application/json"}
    with PeakRss(server.process.pid, interval=0.005) as memory:
        declared = httpx.post(url, content=_sign_in_body(40 * MB), headers=headers, timeout=60)
        streamed = httpx.post(
            url, content=_pieces(40 * MB, b'{"user": '), headers=headers, timeout=60
        )
    for answer in (declared, streamed):
        assert answer.status_code == 413
        assert answer.json() == {"error_message": TOO_LARGE.format(4096)}
    grew = memory.peak - memory.start
    print(f"\n40 MB sign-in x2: API RSS {memory.start / MB:.0f} MB, peak +{grew / MB:.1f} MB")
    assert memory.samples >= 3  # sampled while the bodies arrived
    assert grew < FLAT


def test_a_3_mib_json_create_of_empty_objects_is_refused_and_costs_no_memory(
    server: Server, tenant: Tenant
) -> None:
    _warm(server, tenant)
    settings = get_settings()
    limit = JSON_OVERHEAD_BYTES + settings.json_messages_cap * settings.json_message_bytes
    url = f"{server.url}/api/campaigns/trigger"
    head = f'{{"campaign_id": "{tenant.plain}", "messages": ['.encode()
    body = head + b",".join([b"{}"] * (3 * MB // 3)) + b"]}"
    assert len(body) > 3 * MB
    under_limit = head + b",".join([b"{}"] * ((limit - len(head)) // 3)) + b"]}"
    assert len(under_limit) <= limit
    headers = {**tenant.auth(), "Content-Type": "application/json"}
    with PeakRss(server.process.pid, interval=0.005) as memory:
        declared = httpx.post(url, content=body, headers=headers, timeout=60)
        streamed = httpx.post(url, content=_pieces(len(body), b"{},"), headers=headers, timeout=60)
        parsed = httpx.post(url, content=under_limit, headers=headers, timeout=60)
    message = (
        f"The JSON body is larger than the {limit} bytes allowed (at most "
        f"{settings.json_messages_cap} messages per JSON call); send the messages as a CSV "
        "file (multipart/form-data, form key 'file')"
    )
    for answer in (declared, streamed):
        assert (answer.status_code, answer.json()) == (413, {"error_message": message})
    # within the byte limit, decoding stops at the first object past the cap's needs
    assert parsed.status_code == 400
    assert parsed.json()["error_message"].startswith("Too many messages: at most 1000")
    grew = memory.peak - memory.start
    print(
        f"\n3 MiB of {{}} x2 + 2 MiB: API RSS {memory.start / MB:.0f} MB, peak +{grew / MB:.1f} MB"
    )
    assert grew < FLAT


def test_limits_come_before_authentication(server: Server, tenant: Tenant) -> None:
    big = b'{"device_id": "' + b"d" * 20_000 + b'"}'
    app = tenant_app(tenant)
    device = httpx.post(
        f"{server.url}/api/apps/{app.app_id}/devices",
        content=big,
        headers={"Content-Type": "application/json", "X-App-Key": "not a key"},
    )
    assert (device.status_code, device.json()) == (413, {"error_message": TOO_LARGE.format(8192)})
    trigger = httpx.post(
        f"{server.url}/api/campaigns/trigger",
        content=b"[" + b"{}," * (MB) + b"{}]",
        headers={"Content-Type": "application/json", "Authorization": "Bearer forged"},
    )
    assert trigger.status_code == 413
    small = httpx.post(
        f"{server.url}/api/apps/{app.app_id}/devices",
        json={"device_id": "d"},
        headers={"X-App-Key": "not a key"},
    )
    assert small.status_code == 401  # a body within its limit reaches authentication


def test_form_fields_other_than_the_file_are_small(server: Server, tenant: Tenant) -> None:
    answer = httpx.post(
        f"{server.url}/api/campaigns/trigger",
        headers=tenant.auth(),
        files={
            "campaign_id": (None, "c" * 70_000),
            "file": ("u.csv", b"User\nu1\n", "text/csv"),
        },
    )
    assert answer.status_code == 413
    assert answer.json() == {
        "error_message": "The form field 'campaign_id' is larger than the 65536 bytes allowed"
    }
