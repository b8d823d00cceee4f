"""Google's side of the sandbox: the OAuth2 token endpoint and FCM HTTP v1 ``messages:send``.

Token endpoint (JWT-bearer grant, RFC 7523), as Google answers it: the assertion must be
RS256-signed by a known service-account key (by ``kid``; without one, by a key of the
``iss`` account), have ``aud`` = the token URI it was posted to (or Google's own
``https://oauth2.googleapis.com/token``), ``exp - iat <= 3600``, not be issued in the
future (60 s leeway) nor expired; else 400 ``invalid_grant`` with Google's wording.
Access tokens it issues live 3599 s; a send with anything else is 401 UNAUTHENTICATED.
"""

from __future__ import annotations

import hashlib
import itertools
import secrets
import time
from typing import Any, Final
from urllib.parse import parse_qs

import jwt
import orjson

from campaign_trigger.delivery import sandbox_fcm_schema as schema
from campaign_trigger.delivery.auth import FCM_SCOPE, JWT_BEARER
from campaign_trigger.delivery.base import MAX_PAYLOAD_BYTES
from campaign_trigger.delivery.credentials import GOOGLE_TOKEN_URI
from campaign_trigger.delivery.sandbox_exchange import JSON_TYPE, Reply, Request, json_reply
from campaign_trigger.delivery.sandbox_rules import bad_request, fcm_outcome, google_error
from campaign_trigger.delivery.sandbox_state import AccessToken, Delivery, SandboxState

LEEWAY_SECONDS: Final = 60
MAX_ASSERTION_LIFETIME: Final = 3600
SEND_SCOPES: Final = frozenset({FCM_SCOPE, "https://www.googleapis.com/auth/cloud-platform"})
SHORT_LIVED: Final = (
    "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable timeframe. "
    "Check your iat and exp values in the JWT claim."
)
_UNAUTHENTICATED: Final = json_reply(
    401,
    google_error(
        401,
        "UNAUTHENTICATED",
        "Request had invalid authentication credentials. Expected OAuth 2 access token, "
        "login cookie or other valid authentication credential.",
    ),
    headers=((b"www-authenticate", b'Bearer realm="https://accounts.google.com/"'),),
)
_TOO_BIG: Final = json_reply(
    400, google_error(400, "INVALID_ARGUMENT", "Request contains an invalid argument.")
)
_names = itertools.count(1)
_PROCESS: Final = secrets.token_hex(8).encode()
_JSON: Final = ((b"content-type", JSON_TYPE),)


def _grant_error(error: str, description: str) -> Reply:
    return json_reply(400, {"error": error, "error_description": description})


def _check_assertion(state: SandboxState, assertion: str, audience: str) -> dict[str, Any] | Reply:
    """The assertion's claims if Google would accept it, else the refusal."""
    try:
        header = jwt.get_unverified_header(assertion)
        claims = jwt.decode(assertion, options={"verify_signature": False})
    except jwt.PyJWTError:
        return _grant_error("invalid_grant", "Invalid JWT.")
    if header.get("alg") != "RS256" or any(c not in claims for c in ("iss", "aud", "iat", "exp")):
        return _grant_error("invalid_grant", "Invalid JWT.")
    if not claims.get("scope"):
        return _grant_error("invalid_scope", "Invalid OAuth scope or ID token audience provided.")
    issuer, kid = str(claims["iss"]), header.get("kid")
    if kid:
        key = state.keys.get("google", str(kid))
        candidates = [key] if key is not None and key.owner in (None, issuer) else []
    else:
        candidates = state.keys.owned_by("google", issuer)
    for candidate in candidates:
        try:
            jwt.decode(
                assertion,
                candidate.public_key,  # type: ignore[arg-type]
                algorithms=["RS256"],
                options={"verify_aud": False, "verify_exp": False, "verify_iat": False},
            )
            signer = candidate.key_id
            break
        except jwt.PyJWTError:
            continue
    else:
        return _grant_error("invalid_grant", "Invalid JWT Signature.")
    if claims["aud"] not in (audience, GOOGLE_TOKEN_URI):
        return _grant_error("invalid_grant", "Invalid JWT: Failed audience check.")
    try:
        issued, expires = int(claims["iat"]), int(claims["exp"])
    except (TypeError, ValueError):
        return _grant_error("invalid_grant", SHORT_LIVED)
    now = time.time()
    lifetime = expires - issued
    if (
        issued > now + LEEWAY_SECONDS
        or expires <= now
        or not 0 < lifetime <= MAX_ASSERTION_LIFETIME
    ):
        return _grant_error("invalid_grant", SHORT_LIVED)
    return {"header": header, "claims": claims, "key_id": signer}


def token_endpoint(state: SandboxState, request: Request) -> Reply:
    """``POST /token``: the JWT-bearer grant."""
    state.token_requests += 1
    form = parse_qs(request.body.decode("utf-8", "replace"))
    grant_type = (form.get("grant_type") or [""])[0]
    if grant_type != JWT_BEARER:
        return _grant_error("unsupported_grant_type", f"Invalid grant_type: {grant_type}")
    assertion = (form.get("assertion") or [""])[0]
    audience = f"{request.scheme}://{request.authority}{request.path.decode('latin-1')}"
    checked = _check_assertion(state, assertion, audience)
    if isinstance(checked, Reply):
        return checked
    state.assertions.append(checked)
    claims = checked["claims"]
    scopes = set(str(claims["scope"]).split())
    token = state.issue_access_token(
        client_email=str(claims["iss"]),
        may_send=bool(scopes & SEND_SCOPES),
        key_id=str(checked["key_id"]),
    )
    body = {"access_token": token, "expires_in": 3599, "token_type": "Bearer"}
    return json_reply(200, body)


def _authorised(state: SandboxState, request: Request) -> Reply | AccessToken:
    scheme, _, token = request.headers.get(b"authorization", b"").partition(b" ")
    entry = state.access_tokens.get(token.decode("latin-1"))
    if scheme.lower() != b"bearer" or entry is None or entry.expires_at < time.monotonic():
        return _UNAUTHENTICATED
    if not entry.may_send:
        return json_reply(
            403,
            google_error(
                403, "PERMISSION_DENIED", "Request had insufficient authentication scopes."
            ),
        )
    return entry


def _project_denied(project: str) -> Reply:
    denied = (
        f"Permission 'cloudmessaging.messages.create' denied on resource "
        f"'//cloudresourcemanager.googleapis.com/projects/{project}' (or it may not exist)."
    )
    return json_reply(403, google_error(403, "PERMISSION_DENIED", denied))


def fcm_send(state: SandboxState, request: Request, project: str) -> Reply:
    """``POST /v1/projects/{project}/messages:send``."""
    access = _authorised(state, request)
    if isinstance(access, Reply):
        return access
    signer = state.keys.get("google", access.key_id)
    if signer is not None and not signer.allows(project):  # another project's account
        return _project_denied(project)
    if project.startswith("denied-"):
        return _project_denied(project)
    try:
        document: dict[str, Any] = orjson.loads(request.body)
    except orjson.JSONDecodeError as exc:
        return json_reply(400, bad_request([(f"Invalid JSON payload received. {exc}", None)]))
    problems = schema.validate(document)
    if problems:
        return json_reply(400, bad_request(problems))
    message: dict[str, Any] = document.get("message") or {}
    target = schema.recipient(message)
    if target is None:
        return json_reply(400, bad_request([("Recipient of the message is not set.", "message")]))
    if len(request.body) > MAX_PAYLOAD_BYTES:  # else the payload is smaller still
        payload = {key: value for key, value in message.items() if key not in schema.TARGETS}
        if len(orjson.dumps(payload)) > MAX_PAYLOAD_BYTES:
            return _TOO_BIG
    dry_run = bool(document.get("validate_only") or document.get("validateOnly"))
    message_id = "fcm-" + hashlib.blake2b(request.body, digest_size=16).hexdigest()
    if not dry_run:
        state.attempted(target)
    answer = fcm_outcome(state, target, message_id, dry_run=dry_run)
    if answer is not None:
        status, body, headers = answer
        return json_reply(status, body, headers=headers, delayed=True)
    if dry_run:
        state.validated += 1
        return json_reply(
            200, {"name": f"projects/{project}/messages/fake_message_id"}, delayed=True
        )
    collapse = schema.collapse_id(message)
    now = time.time_ns()
    state.accept(
        Delivery(
            "android",
            target,
            message_id,
            collapse,
            request.body,
            now / 1e9,
            None,
            (access.key_id, access.client_email),
            project,
        )
    )
    name = b"projects/%s/messages/0:%d%%%s%x" % (
        project.encode(),
        now // 1000,
        _PROCESS,
        next(_names),
    )
    return Reply(200, _JSON, b'{"name":"%s"}' % name, delayed=True)
