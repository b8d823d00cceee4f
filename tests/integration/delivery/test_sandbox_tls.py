"""TLS: the sandbox's local CA, ALPN h2 and http/1.1, and our clients trusting it."""

from __future__ import annotations

import ssl

import httpx
import pytest
from cryptography import x509
from push_helpers import message
from sandbox_helpers import APNS_BODY, access_token, apns_headers

from campaign_trigger.config import Settings, get_settings
from campaign_trigger.delivery.apns import ApnsProvider
from campaign_trigger.delivery.credentials import apns_credentials, fcm_credentials
from campaign_trigger.delivery.fcm import FcmProvider
from campaign_trigger.delivery.sandbox_tls import ensure_server_files


def trusting() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(get_settings().home / "sandbox-ca.pem"))


def test_the_tls_port_speaks_h2_and_http11_by_alpn(sandbox: str, sandbox_tls: str) -> None:
    with httpx.Client(http2=True, verify=trusting()) as h2:
        apns = h2.post(f"{sandbox_tls}/3/device/ok-tls", content=APNS_BODY, headers=apns_headers())
    assert (apns.http_version, apns.status_code) == ("HTTP/2", 200)
    bearer = access_token(sandbox)  # issued on cleartext, good on TLS: one sandbox
    with httpx.Client(verify=trusting()) as h1:
        sent = h1.post(
            f"{sandbox_tls}/v1/projects/p/messages:send",
            json={"message": {"token": "ok-tls-fcm"}},
            headers={"authorization": f"Bearer {bearer}"},
        )
        stats = h1.get(f"{sandbox_tls}/sandbox/stats").json()
    assert (sent.http_version, sent.status_code) == ("HTTP/1.1", 200)
    assert stats["per_token"] == {"ok-tls": 1, "ok-tls-fcm": 1}


def test_a_client_that_does_not_trust_the_ca_refuses_the_certificate(sandbox_tls: str) -> None:
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{sandbox_tls}/sandbox/stats")


def test_the_ca_is_made_once_and_the_certificate_names_the_loopback(sandbox_tls: str) -> None:
    home = get_settings().home
    ca_before = (home / "sandbox-ca.pem").read_bytes()
    files = ensure_server_files(home, host="127.0.0.1")
    assert files.ca.read_bytes() == ca_before
    for name in ("sandbox-ca-key.pem", "sandbox-tls-key.pem"):
        assert (home / name).stat().st_mode & 0o777 == 0o600
    leaf = x509.load_pem_x509_certificates(files.certificate.read_bytes())[0]
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} >= {"127.0.0.1", "::1"}
    with httpx.Client(http2=True, verify=trusting()) as h2:
        assert h2.get(sandbox_tls.replace("127.0.0.1", "localhost") + "/sandbox/stats").is_success


async def test_our_clients_send_over_tls_trusting_the_sandbox_ca(
    settings: Settings, sandbox_tls: str
) -> None:
    tls = settings.model_copy(
        update={
            "fcm_base_url": sandbox_tls,
            "fcm_token_uri": f"{sandbox_tls}/token",
            "apns_base_url": sandbox_tls,
        }
    )
    fcm, apns = FcmProvider(fcm_credentials(tls)), ApnsProvider(apns_credentials(tls))
    try:
        android = await fcm.send_many([message(i, f"ok-tls-a{i}") for i in range(20)])
        ios = await apns.send_many([message(i, f"ok-tls-i{i}") for i in range(20)])
    finally:
        await fcm.aclose()
        await apns.aclose()
    assert [r.error_message for r in android + ios] == [""] * 40
    deliveries = httpx.get(f"{settings.fcm_base_url}/sandbox/deliveries").json()
    assert len(deliveries) == 40
    assert {d["http_version"] for d in deliveries if d["platform"] == "ios"} == {"2"}
