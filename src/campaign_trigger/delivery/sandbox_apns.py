"""Apple's side of the sandbox: ``POST /3/device/{token}``, checked as APNs checks it.

In order (Apple's "Handling notification responses from APNs"): HTTP/2 only; 405
``MethodNotAllowed``; 400 ``MissingDeviceToken``; 400 ``DuplicateHeaders``; the provider
token — 403 ``MissingProviderToken``, ``InvalidProviderToken`` (not ES256, unknown
``kid``, a team that does not own the key, a bad signature, an ``iat`` in the future
beyond 60 s of leeway) or ``ExpiredProviderToken`` (``iat`` over an hour old); then the
headers (``MissingTopic``, ``InvalidPushType``, ``BadPriority``, ``BadExpirationDate``,
``BadMessageId``, ``BadCollapseId`` over 64 bytes) and the payload (``PayloadEmpty``,
413 ``PayloadTooLarge`` over 4,096 bytes, 5,120 for ``voip`` pushes). Every answer
carries ``apns-id``; a success has an empty body.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from typing import Final, NamedTuple

import jwt
import orjson

from campaign_trigger.delivery.base import MAX_PAYLOAD_BYTES
from campaign_trigger.delivery.sandbox_exchange import HTTP2_REQUIRED, Reply, Request, json_reply
from campaign_trigger.delivery.sandbox_rules import apns_outcome
from campaign_trigger.delivery.sandbox_state import Delivery, SandboxState

LEEWAY_SECONDS: Final = 60
PROVIDER_TOKEN_TTL: Final = 3600
VOIP_MAX_PAYLOAD_BYTES: Final = 5120
MAX_COLLAPSE_ID_BYTES: Final = 64
PUSH_TYPES: Final = frozenset(
    {b"alert", b"background", b"location", b"voip", b"complication", b"fileprovider", b"mdm"}
    | {b"liveactivity", b"pushtotalk", b"widgets", b"controls"}
)
_UUID = re.compile(
    rb"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
)
_STATUS = {
    "MissingProviderToken": 403,
    "InvalidProviderToken": 403,
    "ExpiredProviderToken": 403,
    "PayloadTooLarge": 413,
    "MethodNotAllowed": 405,
    "BadPath": 404,
}


class ProviderToken(NamedTuple):
    """A verified provider JWT."""

    issued_at: int
    fingerprint: str  # what deliveries show (not the token itself)
    key_id: str
    team_id: str
    topics: tuple[str, ...]  # the bundle ids its key may push to; () = any


def refusal(reason: str, apns_id: bytes) -> Reply:
    """Apple's error answer: ``{"reason": ...}`` and the ``apns-id``."""
    return json_reply(
        _STATUS.get(reason, 400), {"reason": reason}, headers=((b"apns-id", apns_id),)
    )


def _verify(state: SandboxState, raw: bytes) -> ProviderToken | None:
    """Check the signature and claims of a provider JWT (results cached by token)."""
    cached: ProviderToken | None = state.verified_jwts.get(raw)
    if cached is not None:
        return cached
    token = raw.decode("latin-1")
    try:
        header = jwt.get_unverified_header(token)
        claims = jwt.decode(token, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    kid, issuer, issued = header.get("kid"), claims.get("iss"), claims.get("iat")
    if header.get("alg") != "ES256" or not kid or not issuer or not isinstance(issued, int):
        return None
    key = state.keys.get("apns", str(kid))
    if key is None or key.owner not in (None, str(issuer)):
        return None
    try:
        jwt.decode(
            token,
            key.public_key,  # type: ignore[arg-type]
            algorithms=["ES256"],
            options={"verify_exp": False, "verify_iat": False, "verify_nbf": False},
        )
    except jwt.PyJWTError:
        return None
    verified = ProviderToken(
        issued, hashlib.sha256(raw).hexdigest()[:16], key.key_id, str(issuer), key.scope
    )
    if len(state.verified_jwts) > 10_000:
        state.verified_jwts.clear()
    state.verified_jwts[raw] = verified
    return verified


def _header_problem(request: Request, apns_id: bytes) -> str | None:
    headers = request.headers
    if not headers.get(b"apns-topic"):
        return "MissingTopic"
    if headers.get(b"apns-push-type", b"alert") not in PUSH_TYPES:
        return "InvalidPushType"
    priority = headers.get(b"apns-priority", b"10")
    if priority not in (b"1", b"5", b"10"):
        return "BadPriority"
    if priority == b"10" and headers.get(b"apns-push-type") == b"background":
        return "BadPriority"  # Apple: a background notification must not be sent at 10
    if not headers.get(b"apns-expiration", b"0").isdigit():
        return "BadExpirationDate"
    if b"apns-id" in headers and not _UUID.match(apns_id):
        return "BadMessageId"
    if len(headers.get(b"apns-collapse-id", b"")) > MAX_COLLAPSE_ID_BYTES:
        return "BadCollapseId"
    body = request.body
    if not body:
        return "PayloadEmpty"
    limit = (
        VOIP_MAX_PAYLOAD_BYTES if headers.get(b"apns-push-type") == b"voip" else MAX_PAYLOAD_BYTES
    )
    if len(body) > limit:
        return "PayloadTooLarge"
    return None


def apns_send(state: SandboxState, request: Request, device_token: str) -> Reply:
    """``/3/device/{token}``."""
    if request.http_version != "2":
        return Reply(HTTP2_REQUIRED, (), b'{"reason":"APNs requires HTTP/2"}')
    apns_id = request.headers.get(b"apns-id") or str(uuid.uuid4()).upper().encode()
    if request.method != b"POST":
        return refusal("MethodNotAllowed", apns_id)
    if not device_token:
        return refusal("MissingDeviceToken", apns_id)
    if request.repeated:
        return refusal("DuplicateHeaders", apns_id)
    scheme, _, raw = request.headers.get(b"authorization", b"").partition(b" ")
    if scheme.lower() != b"bearer" or not raw:
        return refusal("MissingProviderToken", apns_id)
    provider = _verify(state, raw)
    now = time.time()
    if provider is None or provider.issued_at > now + LEEWAY_SECONDS:
        return refusal("InvalidProviderToken", apns_id)
    if now - provider.issued_at > PROVIDER_TOKEN_TTL:
        return refusal("ExpiredProviderToken", apns_id)
    problem = _header_problem(request, apns_id)
    if problem is None:
        try:
            document = orjson.loads(request.body)
        except orjson.JSONDecodeError:
            document = None
        if not isinstance(document, dict) or not isinstance(document.get("aps"), dict):
            problem = "PayloadEmpty"
    topic = request.headers.get(b"apns-topic", b"").decode("latin-1")
    if problem is None and provider.topics and topic not in provider.topics:
        problem = "TopicDisallowed"  # the key's team has no app of this bundle id
    if problem is not None:
        return refusal(problem, apns_id)
    state.attempted(device_token)
    answer = apns_outcome(state, device_token, apns_id.decode("latin-1"), provider.fingerprint)
    if answer is not None:
        status, body, more = answer
        return json_reply(status, body, headers=((b"apns-id", apns_id), *more), delayed=True)
    headers = request.headers
    collapse = headers.get(b"apns-collapse-id")
    extra = (
        headers[b"apns-topic"].decode("latin-1"),
        headers.get(b"apns-push-type", b"alert").decode("latin-1"),
        provider.fingerprint,
        request.http_version,
        headers.get(b"apns-priority", b"10").decode("latin-1"),
        headers.get(b"apns-expiration", b"").decode("latin-1"),
    )
    state.accept(
        Delivery(
            "ios",
            device_token,
            apns_id.decode("latin-1"),
            collapse.decode("utf-8", "replace") if collapse else None,
            request.body,
            now,
            extra,
            (provider.key_id, provider.team_id),
        )
    )
    return Reply(200, ((b"apns-id", apns_id),), b"", delayed=True)
