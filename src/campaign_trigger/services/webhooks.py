"""Completion webhooks: an organisation's endpoints, and the events its requests make.

An owner or admin registers an HTTPS URL (any URL in sandbox mode, ``CT_SEND_TO_SANDBOX``)
and gets its signing secret once; the secret is stored sealed (``services/sealed.py``).
When a request reaches a final state — processed, cancelled, failed —
:func:`record_final_state` writes one :class:`WebhookDelivery` per endpoint of the
organisation, in the transaction that writes the state: the webhooks' outbox, which the
workers' sender (``services/webhook_sender.py``) drains. Nothing here talks to the
network, so a receiver can never delay or fail a request.
"""

from __future__ import annotations

import ipaddress
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Final
from urllib.parse import urlsplit

from sqlalchemy import func
from sqlmodel import Session, col, delete, select

from campaign_trigger.config import Settings
from campaign_trigger.errors import Forbidden, InvalidInput
from campaign_trigger.services.auth import Identity
from campaign_trigger.services.sealed import seal
from campaign_trigger.store.models import (
    Outcome,
    Request,
    RequestState,
    Role,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    utcnow,
)

MAX_ENDPOINTS: Final = 20
MAX_URL_LENGTH: Final = 2000
MANAGER_ROLES: Final = (Role.owner, Role.admin)
EVENT_TYPES: Final = {
    RequestState.processed: "request.processed",
    RequestState.canceled: "request.cancelled",
    RequestState.failed: "request.failed",
}
HTTPS_ONLY = "The webhook URL must be an https:// URL"
PRIVATE_ADDRESS = (
    "The webhook URL must not point to a private, loopback, link-local or reserved address"
)
LOCAL_NAMES: Final = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})
BAD_URL = "The webhook URL must be an absolute URL with a host (ASCII, no spaces)"
TOO_MANY = f"An organisation may register at most {MAX_ENDPOINTS} webhook endpoints"


class WebhookNotFound(InvalidInput):
    """No such endpoint for this organisation."""

    def __init__(self, endpoint_id: str) -> None:
        super().__init__(f"The webhook {endpoint_id} was not found")


@dataclass(frozen=True)
class Registered:
    endpoint: WebhookEndpoint
    secret: str  # shown once


@dataclass(frozen=True)
class AttemptView:
    event_id: str
    event_type: str
    request_id: str
    attempted_at: datetime
    status_code: int | None
    error: str | None
    duration_ms: int


def secret_context(endpoint_id: str) -> str:
    """Where a sealed endpoint secret belongs (a value copied elsewhere does not open)."""
    return f"webhook:{endpoint_id}"


def require_manager(identity: Identity) -> None:
    """Forbidden unless the role may manage the organisation's webhooks."""
    if identity.role not in MANAGER_ROLES:
        raise Forbidden(f"The role {identity.role.value} may not manage webhooks")


def check_url(*, settings: Settings, url: str) -> str:
    """The URL, if we may POST events to it: https, or any http(s) in sandbox mode."""
    url = url.strip()
    if not (url.isascii() and url.isprintable()) or " " in url:  # IDNs as punycode
        raise InvalidInput(BAD_URL)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018  (raises on a bad port)
    except ValueError:
        raise InvalidInput(BAD_URL) from None
    if len(url) > MAX_URL_LENGTH or not parts.hostname or parts.scheme not in ("https", "http"):
        raise InvalidInput(BAD_URL)
    if parts.scheme != "https" and not settings.send_to_sandbox:
        raise InvalidInput(HTTPS_ONLY)
    if not private_allowed(settings) and (
        parts.hostname.lower().rstrip(".") in LOCAL_NAMES or _private_literal(parts.hostname)
    ):
        raise InvalidInput(PRIVATE_ADDRESS)
    return url


def private_allowed(settings: Settings) -> bool:
    """Whether events may go to our own network (sandbox mode, or the operator says so)."""
    return settings.send_to_sandbox or settings.webhook_allow_private_addresses


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")  # RFC 6052, well-known prefix
_LOCAL_NAT64 = ipaddress.IPv6Network("64:ff9b:1::/48")  # RFC 8215, a network's own
_IPV4_COMPATIBLE = ipaddress.IPv6Network("::/96")  # deprecated, still routed by some stacks


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one reaches: IPv4-mapped, 6to4 (2002::/16), NAT64
    (64:ff9b::/96) and IPv4-compatible addresses carry it; None for the others."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64 or ip in _IPV4_COMPATIBLE:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def is_private(address: str) -> bool:
    """True unless ``address`` (an IP) is a public unicast one: private, loopback,
    link-local (cloud metadata at 169.254.169.254), shared, reserved and multicast
    addresses are ours or nobody's. An IPv6 address carrying an IPv4 one (IPv4-mapped,
    6to4, NAT64, IPv4-compatible) is judged as that IPv4 address, which a translator
    would reach (``64:ff9b::a9fe:a9fe`` is the metadata address); a local NAT64 prefix
    (64:ff9b:1::/48) is private."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _LOCAL_NAT64:
            return True
        embedded = _embedded_ipv4(ip)
        if embedded is not None:
            ip = embedded
    return not ip.is_global or ip.is_multicast


def _private_literal(host: str) -> bool:
    try:
        return is_private(host.strip("[]"))
    except ValueError:  # a name, not an address: judged when it is resolved, at each POST
        return False


def register(*, session: Session, settings: Settings, org_id: int, url: str) -> Registered:
    """A new endpoint of the organisation, with its fresh secret (the caller commits)."""
    url = check_url(settings=settings, url=url)
    count = session.exec(
        select(func.count()).select_from(WebhookEndpoint).where(WebhookEndpoint.org_id == org_id)
    ).one()
    if count >= MAX_ENDPOINTS:
        raise InvalidInput(TOO_MANY)
    endpoint_id = f"whk_{uuid.uuid4().hex}"
    secret = f"whsec_{secrets.token_urlsafe(32)}"
    endpoint = WebhookEndpoint(
        id=endpoint_id,
        org_id=org_id,
        url=url,
        sealed_secret=seal(settings, secret.encode(), context=secret_context(endpoint_id)),
    )
    session.add(endpoint)
    session.flush()
    return Registered(endpoint=endpoint, secret=secret)


def endpoints(*, session: Session, org_id: int) -> list[WebhookEndpoint]:
    """The organisation's endpoints, oldest first."""
    return list(
        session.exec(
            select(WebhookEndpoint)
            .where(WebhookEndpoint.org_id == org_id)
            .order_by(col(WebhookEndpoint.created_at), col(WebhookEndpoint.id))
        ).all()
    )


def _endpoint(session: Session, *, org_id: int, endpoint_id: str) -> WebhookEndpoint:
    endpoint = session.get(WebhookEndpoint, endpoint_id)
    if endpoint is None or endpoint.org_id != org_id:
        raise WebhookNotFound(endpoint_id)
    return endpoint


def remove(*, session: Session, org_id: int, endpoint_id: str) -> None:
    """Forget the endpoint, its pending events and its attempts (the caller commits)."""
    endpoint = _endpoint(session, org_id=org_id, endpoint_id=endpoint_id)
    deliveries = select(WebhookDelivery.id).where(WebhookDelivery.endpoint_id == endpoint.id)
    session.exec(delete(WebhookAttempt).where(col(WebhookAttempt.delivery_id).in_(deliveries)))
    session.exec(delete(WebhookDelivery).where(col(WebhookDelivery.endpoint_id) == endpoint.id))
    session.delete(endpoint)


def attempts(
    *, session: Session, org_id: int, endpoint_id: str, limit: int = 100, offset: int = 0
) -> list[AttemptView]:
    """The endpoint's attempts, newest first."""
    _endpoint(session, org_id=org_id, endpoint_id=endpoint_id)
    rows = session.exec(
        select(WebhookAttempt, WebhookDelivery)
        .join(WebhookDelivery, col(WebhookDelivery.id) == col(WebhookAttempt.delivery_id))
        .where(WebhookDelivery.endpoint_id == endpoint_id)
        .order_by(col(WebhookAttempt.id).desc())
        .limit(limit)
        .offset(offset)
    ).all()
    return [
        AttemptView(
            event_id=delivery.event_id,
            event_type=delivery.event_type,
            request_id=delivery.request_id,
            attempted_at=attempt.attempted_at,
            status_code=attempt.status_code,
            error=attempt.error,
            duration_ms=attempt.duration_ms,
        )
        for attempt, delivery in rows
    ]


def waiting_events(*, session: Session) -> int:
    """Events not yet accepted by their receiver and still to be tried (all organisations)."""
    waiting = select(func.count()).where(col(WebhookDelivery.next_attempt_at).is_not(None))
    return int(session.exec(waiting).one())


def purge_settled(*, session: Session, before: datetime) -> int:
    """Forget events delivered or given up that happened before ``before``, with their
    attempts (the caller commits); returns how many."""
    settled = select(WebhookDelivery.id).where(
        col(WebhookDelivery.next_attempt_at).is_(None), col(WebhookDelivery.created_at) < before
    )
    ids = list(session.exec(settled).all())
    if ids:
        session.exec(delete(WebhookAttempt).where(col(WebhookAttempt.delivery_id).in_(ids)))
        session.exec(delete(WebhookDelivery).where(col(WebhookDelivery.id).in_(ids)))
    return len(ids)


def _counts(session: Session, request_id: str) -> dict[str, int]:
    """The request's report rows per outcome (``sent``, or the report's error message)."""
    rows = session.exec(
        select(Outcome.error_message, func.count())
        .where(Outcome.request_id == request_id)
        .group_by(col(Outcome.error_message))
    ).all()
    return {message or "sent": count for message, count in rows}


def record_final_state(*, session: Session, request_id: str, state: RequestState) -> int:
    """Queue the event of a request that just reached ``state`` for each endpoint of its
    organisation, in the caller's transaction; returns how many were queued."""
    event_type = EVENT_TYPES.get(state)
    if event_type is None:
        return 0
    request = session.exec(
        select(
            Request.org_id, Request.campaign_id, Request.message_count, Request.report_paths
        ).where(Request.id == request_id)
    ).first()
    if request is None:
        return 0
    org_id, campaign_id, message_count, report_paths = request
    endpoint_ids = session.exec(
        select(WebhookEndpoint.id).where(WebhookEndpoint.org_id == org_id)
    ).all()
    if not endpoint_ids:
        return 0
    now = utcnow()
    payload = {
        "request_id": request_id,
        "campaign_id": campaign_id,
        "state": event_type.removeprefix("request."),
        "message_count": message_count,
        "counts": _counts(session, request_id),
        "report_paths": list(report_paths or []),
    }
    event_id = f"evt_{uuid.uuid4().hex}"
    session.add_all(
        WebhookDelivery(
            endpoint_id=endpoint_id,
            event_id=event_id,
            event_type=event_type,
            request_id=request_id,
            payload=payload,
            created_at=now,
            next_attempt_at=now,
        )
        for endpoint_id in endpoint_ids
    )
    return len(endpoint_ids)
