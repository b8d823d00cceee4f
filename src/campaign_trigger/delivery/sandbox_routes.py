"""The sandbox's routes: a :class:`~campaign_trigger.delivery.sandbox_exchange.Request` in,
a :class:`~campaign_trigger.delivery.sandbox_exchange.Reply` out, whatever the protocol.

Provider routes answer in the provider's format, whatever is wrong with the request:
``/token`` and ``/v1/...`` as Google, ``/3/...`` and any other unknown path as Apple
(``BadPath``). Inspection routes (``/sandbox/...``) answer ``{"error_message": ...}``.
"""

from __future__ import annotations

from typing import Any, Final
from urllib.parse import parse_qs, unquote

import orjson

from campaign_trigger.delivery.sandbox_apns import apns_send, refusal
from campaign_trigger.delivery.sandbox_exchange import HTTP2_REQUIRED, Reply, Request, json_reply
from campaign_trigger.delivery.sandbox_google import fcm_send, token_endpoint
from campaign_trigger.delivery.sandbox_keys import KeyRejected
from campaign_trigger.delivery.sandbox_rules import google_error
from campaign_trigger.delivery.sandbox_state import SandboxState

_SEND_PREFIX: Final = b"/v1/projects/"
_SEND_SUFFIX: Final = b"/messages:send"
_DEVICE_PREFIX: Final = b"/3/device/"


def _error(status: int, message: str) -> Reply:
    return json_reply(status, {"error_message": message})


def _google_not_found() -> Reply:
    return json_reply(404, google_error(404, "NOT_FOUND", "Method not found."))


class Router:
    """Routes for one sandbox's memory."""

    def __init__(self, state: SandboxState) -> None:
        self.state = state

    def __call__(self, request: Request) -> Reply:
        path = request.path
        if path.startswith(_DEVICE_PREFIX):
            token = unquote(path[len(_DEVICE_PREFIX) :].decode("latin-1"))
            return apns_send(self.state, request, token)
        if path.startswith(_SEND_PREFIX):
            project = path[len(_SEND_PREFIX) : -len(_SEND_SUFFIX)].decode("latin-1")
            if not path.endswith(_SEND_SUFFIX) or not project or "/" in project:
                return _google_not_found()
            if request.method != b"POST":
                return _google_not_found()
            return fcm_send(self.state, request, project)
        if path == b"/token":
            if request.method != b"POST":
                return json_reply(
                    405, {"error": "invalid_request", "error_description": "POST only"}
                )
            return token_endpoint(self.state, request)
        if path.startswith(b"/sandbox/"):
            return self._inspection(request)
        if path.startswith(b"/v1/"):
            return _google_not_found()
        if path.startswith(b"/3/") and request.http_version != "2":
            return Reply(HTTP2_REQUIRED, (), b'{"reason":"APNs requires HTTP/2"}')
        return refusal("BadPath", request.headers.get(b"apns-id", b""))

    # /sandbox/... ---------------------------------------------------------------------
    def _inspection(self, request: Request) -> Reply:
        name, method = request.path.decode("latin-1")[len("/sandbox/") :], request.method
        state = self.state
        if name == "deliveries" and method == b"GET":
            tokens = parse_qs(request.query.decode("latin-1")).get("token")
            return json_reply(200, state.deliveries_for(tokens[0] if tokens else None))
        if name == "deliveries" and method == b"DELETE":
            state.clear()
            return json_reply(200, {"cleared": True})
        if name == "stats" and method == b"GET":
            return json_reply(200, state.stats())
        if name == "config" and method in (b"GET", b"PUT"):
            return self._config(request) if method == b"PUT" else self._settings()
        if name == "keys" and method == b"GET":
            return json_reply(200, state.keys.describe())
        if name == "keys" and method == b"POST":
            return self._register_key(request)
        if name in ("deliveries", "stats", "config", "keys"):
            return _error(405, f"{method.decode('latin-1')} is not allowed on /sandbox/{name}")
        return _error(404, f"no such sandbox route: /sandbox/{name}")

    def _settings(self) -> Reply:
        return json_reply(200, {"latency_ms": self.state.latency_ms})

    def _body(self, request: Request) -> dict[str, Any] | Reply:
        try:
            document = orjson.loads(request.body)
        except orjson.JSONDecodeError:
            return _error(400, "the body must be a JSON object")
        return (
            document
            if isinstance(document, dict)
            else _error(400, "the body must be a JSON object")
        )

    def _config(self, request: Request) -> Reply:
        document = self._body(request)
        if isinstance(document, Reply):
            return document
        unknown = set(document) - {"latency_ms"}
        if unknown:
            return _error(400, f"unknown settings: {', '.join(sorted(unknown))}")
        try:
            self.state.configure(latency_ms=document.get("latency_ms"))
        except (TypeError, ValueError) as exc:
            return _error(400, f"bad config: {exc}")
        return self._settings()

    def _register_key(self, request: Request) -> Reply:
        document = self._body(request)
        if isinstance(document, Reply):
            return document
        kind = document.get("kind")
        if kind not in ("apns", "google"):
            return _error(400, "kind must be 'apns' or 'google'")
        owner = document.get("team_id") if kind == "apns" else document.get("client_email")
        fields = (document.get("key_id"), document.get("pem"), owner)
        if not all(isinstance(value, str | None) for value in fields):
            return _error(400, "key_id, pem, team_id and client_email must be strings")
        if kind == "google":
            project = document.get("project_id")
            if not isinstance(project, str | None):
                return _error(400, "project_id must be a string")
            scope: tuple[str, ...] = (project,) if project else ()
        else:
            topics = document.get("topics") or []
            if not isinstance(topics, list) or not all(isinstance(t, str) for t in topics):
                return _error(400, "topics must be a list of strings")
            scope = tuple(topics)
        try:
            known = self.state.keys.add(
                kind=kind,
                key_id=str(document.get("key_id") or ""),
                pem=str(document.get("pem") or ""),
                owner=owner,
                scope=scope,
            )
        except KeyRejected as exc:
            return _error(400, str(exc))
        self.state.verified_jwts.clear()
        return json_reply(201, known.describe())
