"""The public keys the sandbox knows, as Apple and Google know the keys of their users.

Two kinds: ``apns`` (EC P-256 keys that sign provider JWTs, by key id, with the team
they belong to) and ``google`` (RSA service-account keys that sign OAuth assertions,
by key id, with the service account's e-mail). The ring starts with the service's own
sandbox keys (``sandbox_files.py``) and grows with ``POST /sandbox/keys``, which
accepts a PEM public key, or a private key whose public half is kept (an Apple ``.p8``
is what Apple's console hands out). A key may be bound to what it may send to, as in
Google's and Apple's consoles: a service account to its Firebase project
(``project_id``; a send to another project is ``PERMISSION_DENIED``), an APNs key to
bundle ids (``topics``; another topic is ``TopicDisallowed``); unbound keys send
anywhere. Registered keys are kept in
``CT_HOME/sandbox-keys.json`` (public keys only) so a restarted sandbox still knows them.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from campaign_trigger.delivery import sandbox_files as files

log = logging.getLogger(__name__)

KeyKind = Literal["apns", "google"]
PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey


class KeyRejected(ValueError):
    """A key registration that cannot be accepted (the message says why)."""


@dataclass(frozen=True, slots=True)
class KnownKey:
    """One public key and whose it is."""

    kind: KeyKind
    key_id: str
    owner: str | None  # APNs team id / service-account e-mail; None: anyone's
    public_key: PublicKey
    source: Literal["service", "registered"]
    scope: tuple[str, ...] = ()  # the projects / topics it may send to; () = any

    def allows(self, target: str) -> bool:
        """Whether this key may send to ``target`` (a Firebase project, an APNs topic)."""
        return not self.scope or target in self.scope

    def describe(self) -> dict[str, Any]:
        """What ``GET /sandbox/keys`` shows."""
        pem = self.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        owner = "team_id" if self.kind == "apns" else "client_email"
        scope = "topics" if self.kind == "apns" else "project_ids"
        return {
            "kind": self.kind,
            "key_id": self.key_id,
            owner: self.owner,
            scope: list(self.scope),
            "source": self.source,
            "public_key": pem.decode(),
        }


def load_public_key(pem: str, kind: KeyKind) -> PublicKey:
    """The public key of a PEM public or private key, checked for ``kind``."""
    data = pem.strip().encode()
    key: Any
    try:
        if b"PRIVATE KEY" in data:
            key = serialization.load_pem_private_key(data, password=None).public_key()
        else:
            key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyRejected(f"not a PEM key: {exc}") from None
    if kind == "apns":
        if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != "secp256r1":
            raise KeyRejected("an APNs key must be an EC P-256 key (ES256)")
    elif not isinstance(key, rsa.RSAPublicKey) or key.key_size < 2048:
        raise KeyRejected("a Google service-account key must be an RSA key of 2048+ bits")
    return key  # type: ignore[no-any-return]


class KeyRing:
    """Known keys by kind and key id; thread-safe."""

    def __init__(self, *, store: Path | None = None) -> None:
        self._keys: dict[tuple[KeyKind, str], KnownKey] = {}
        self._store = store
        self._lock = threading.Lock()
        if store is not None and store.exists():
            self._load(store)

    def _load(self, store: Path) -> None:
        try:
            entries = json.loads(store.read_text(encoding="utf-8"))
            for entry in entries:
                self.add(
                    kind=entry["kind"],
                    key_id=entry["key_id"],
                    pem=entry["public_key"],
                    owner=entry.get("owner"),
                    scope=tuple(entry.get("scope") or ()),
                    persist=False,
                )
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("ignoring unreadable %s: %s", store, exc)

    def add(
        self,
        *,
        kind: KeyKind,
        key_id: str,
        pem: str,
        owner: str | None = None,
        source: Literal["service", "registered"] = "registered",
        scope: tuple[str, ...] = (),
        persist: bool = True,
    ) -> KnownKey:
        """Know ``pem``'s public key as ``key_id`` (replacing a key of that id)."""
        if kind not in ("apns", "google"):
            raise KeyRejected("kind must be 'apns' or 'google'")
        if not key_id or len(key_id) > 128:
            raise KeyRejected("key_id must be 1 to 128 characters")
        if any(not isinstance(item, str) or not item for item in scope):
            raise KeyRejected("project_id / topics must be non-empty strings")
        known = KnownKey(
            kind, key_id, owner or None, load_public_key(pem, kind), source, tuple(scope)
        )
        with self._lock:
            self._keys[(kind, key_id)] = known
            if persist and source == "registered" and self._store is not None:
                self._save(self._store)
        return known

    def _save(self, store: Path) -> None:
        entries = [
            {
                "kind": key.kind,
                "key_id": key.key_id,
                "owner": key.owner,
                "scope": list(key.scope),
                "public_key": key.describe()["public_key"],
            }
            for key in self._keys.values()
            if key.source == "registered"
        ]
        temporary = store.with_name(f".{store.name}.tmp")
        temporary.write_text(json.dumps(entries, indent=1), encoding="utf-8")
        temporary.replace(store)

    def get(self, kind: KeyKind, key_id: str) -> KnownKey | None:
        """The key of that kind and id, if known."""
        return self._keys.get((kind, key_id))

    def owned_by(self, kind: KeyKind, owner: str) -> list[KnownKey]:
        """Keys of that kind belonging to ``owner`` (for assertions without a ``kid``)."""
        return [k for k in list(self._keys.values()) if k.kind == kind and k.owner == owner]

    def describe(self) -> list[dict[str, Any]]:
        """Every known key, public parts only."""
        return [key.describe() for key in list(self._keys.values())]


def service_key_ring(
    *, home: Path, apns_key_id: str = "", apns_team_id: str = "", persist: bool = True
) -> KeyRing:
    """The ring of a sandbox serving the service of ``home``: its keys, and those registered."""
    home = home.resolve()
    ring = KeyRing(store=home / files.KEYS_STORE_FILE if persist else None)
    fcm_pem = files.service_fcm_key(home)
    ring.add(
        kind="google",
        key_id=files.google_key_id(fcm_pem),
        pem=fcm_pem,
        owner=files.SANDBOX_CLIENT_EMAIL,
        source="service",
    )
    ring.add(
        kind="apns",
        key_id=apns_key_id or files.SANDBOX_APNS_KEY_ID,
        pem=files.service_apns_key(home),
        owner=apns_team_id or files.SANDBOX_APNS_TEAM_ID,
        source="service",
    )
    return ring
