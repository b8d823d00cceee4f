"""Provider keys as Google's and Apple's consoles hand them out, made fresh for a test,
and their registration with the sandbox (``POST /sandbox/keys``)."""

from __future__ import annotations

import json
import secrets
import string
from dataclasses import dataclass

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa


def _pkcs8(key: rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()


def _apple_id() -> str:
    return "".join(secrets.choice(string.ascii_uppercase + string.digits) for _ in range(10))


@dataclass(frozen=True)
class ServiceAccount:
    """A Firebase service-account key file."""

    project_id: str
    client_email: str
    private_key_id: str
    private_key: str

    def file_bytes(self) -> bytes:
        return json.dumps(
            {
                "type": "service_account",
                "project_id": self.project_id,
                "private_key_id": self.private_key_id,
                "private_key": self.private_key,
                "client_email": self.client_email,
                "client_id": "1234567890",
                "token_uri": "https://oauth2.googleapis.com/token",
            }
        ).encode()

    def register(self, sandbox_url: str) -> None:
        """Known to the sandbox, bound to its project (as Google binds an account)."""
        answer = httpx.post(
            f"{sandbox_url}/sandbox/keys",
            json={
                "kind": "google",
                "key_id": self.private_key_id,
                "client_email": self.client_email,
                "project_id": self.project_id,
                "pem": self.private_key,
            },
        )
        assert answer.status_code == 201, answer.text


def service_account(project_id: str) -> ServiceAccount:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ServiceAccount(
        project_id=project_id,
        client_email=f"push@{project_id}.iam.gserviceaccount.com",
        private_key_id=secrets.token_hex(20),
        private_key=_pkcs8(key),
    )


@dataclass(frozen=True)
class ApnsKey:
    """An Apple ``.p8`` signing key with its key id and team."""

    key_id: str
    team_id: str
    topic: str
    p8: str

    def register(self, sandbox_url: str) -> None:
        """Known to the sandbox, bound to its team's bundle id."""
        answer = httpx.post(
            f"{sandbox_url}/sandbox/keys",
            json={
                "kind": "apns",
                "key_id": self.key_id,
                "team_id": self.team_id,
                "topics": [self.topic],
                "pem": self.p8,
            },
        )
        assert answer.status_code == 201, answer.text


def apns_key(topic: str, *, team_id: str | None = None) -> ApnsKey:
    return ApnsKey(
        key_id=_apple_id(),
        team_id=team_id or _apple_id(),
        topic=topic,
        p8=_pkcs8(ec.generate_private_key(ec.SECP256R1())),
    )


def secret_fragments(pem: str) -> list[str]:
    """Lines of a PEM key's body: none may appear anywhere outside the sealed store."""
    return [line for line in pem.splitlines() if line and not line.startswith("-----")]
