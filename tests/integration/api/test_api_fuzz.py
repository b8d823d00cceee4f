"""Every route's parameters fuzzed with arbitrary Unicode through the real server, on
SQLite and on PostgreSQL: path segments, query values, headers and JSON body members
hold any code point, lone surrogates and NUL included (sent as JSON escapes, or as the
bytes ``surrogatepass`` makes). No answer is a 5xx; every refusal is a 4xx whose body
is ``{"error_message": "..."}``."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from api_devices import register, tenant_app
from api_tenants import Server, Tenant, make_tenant, start_api_server
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlmodel import select

from campaign_trigger.config import get_settings
from campaign_trigger.services.auth import issue_token
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.migrate import upgrade
from campaign_trigger.store.models import Account, App, Role

EXAMPLES = 700
SPECIAL = [
    "\ud800",
    "a\udfffb",
    "\x00",
    "x\x00y",
    "",
    " ",
    "-1",
    "99999999999999999999999",
    "9999-12-31T23:59:59-23:00_1",
    "2026-01-01T00:00:00+00:00_99999999999999999999999",
    "0001-01-01T00:00:00+23:00_1",
    "=1+1",
    "../../etc/passwd",
    "é" * 210,
]
_ANY_CHAR = st.one_of(
    st.characters(),  # any code point but surrogates
    st.characters(categories=["Cs"]),  # lone surrogates
    st.sampled_from("\x00\r\n\t\"'\\/%&?#=;"),
)
TEXT = st.one_of(st.lists(_ANY_CHAR, max_size=40).map("".join), st.sampled_from(SPECIAL))
JSON_VALUE = st.one_of(
    TEXT, st.integers(), st.floats(allow_nan=False), st.booleans(), st.none(), st.just([])
)


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _segment(text: str) -> str:
    return quote(_raw(text), safe="") or "%20"


def _header(text: str) -> bytes:
    """As much of ``text`` as an HTTP/1.1 header value can carry (no CR, LF, NUL...)."""
    kept = "".join(c for c in text if c == "\t" or " " <= c != "\x7f")
    return _raw(kept).strip() or b"-"


@dataclass
class Call:
    method: str
    path: str
    query: dict[str, str] = field(default_factory=dict)
    headers: dict[str, bytes] = field(default_factory=dict)
    body: bytes | None = None
    files: dict[str, Any] | None = None

    def url(self) -> str:
        if not self.query:
            return self.path
        pairs = "&".join(f"{_segment(k)}={_segment(v)}" for k, v in self.query.items())
        return f"{self.path}?{pairs}"


@dataclass
class Context:
    """A tenant's token, its app and a registered device, so calls reach deep code."""

    token: str
    fresh_token: Callable[[], str]  # for sign-out, which revokes the token it is sent
    app: App
    device_id: str
    device_secret: str
    campaign_id: str


def _json(document: Any, raw: bool) -> bytes:
    """JSON with lone surrogates as ``\\udxxx`` escapes, or as raw (invalid) UTF-8."""
    if raw:
        return json.dumps(document, ensure_ascii=False).encode("utf-8", "surrogatepass")
    return json.dumps(document).encode()


def _either(valid: str) -> st.SearchStrategy[str]:
    """Mostly the valid value (so that calls get past authentication), else any text."""
    return st.one_of(st.just(valid), st.just(valid), st.just(valid), TEXT)


def _routes(ctx: Context) -> st.SearchStrategy[Call]:
    bearer = st.one_of(_either(f"Bearer {ctx.token}"), TEXT.map(lambda t: f"Bearer {t}"), TEXT)
    app_id, device_id = _either(ctx.app.app_id), _either(ctx.device_id)
    sdk = st.fixed_dictionaries(
        {"X-App-Key": _either(ctx.app.sdk_key).map(_header)},
        optional={"X-Device-Secret": _either(ctx.device_secret).map(_header)},
    )
    raw = st.booleans()

    def json_call(
        method: str, path: st.SearchStrategy[str], body: Any, headers: Any
    ) -> st.SearchStrategy[Call]:
        return st.builds(
            lambda p, b, r, h: Call(
                method, p, headers={**h, "Content-Type": b"application/json"}, body=_json(b, r)
            ),
            path,
            body,
            raw,
            headers,
        )

    auth = st.fixed_dictionaries({"Authorization": bearer.map(_header)})
    messages = st.lists(
        st.fixed_dictionaries(
            {"user_id": JSON_VALUE},
            optional={"template_variables": st.dictionaries(TEXT, JSON_VALUE, max_size=3)},
        ),
        max_size=3,
    )
    trigger_body = st.builds(
        lambda extra, known: {**extra, **known},
        st.dictionaries(TEXT, JSON_VALUE, max_size=2),
        st.fixed_dictionaries(
            {"campaign_id": st.one_of(st.just(ctx.campaign_id), JSON_VALUE)},
            optional={"send_at": JSON_VALUE, "messages": messages},
        ),
    )
    device_paths = st.builds(
        lambda a, d, end: f"/api/apps/{_segment(a)}/devices/{_segment(d)}/{end}",
        app_id,
        device_id,
        st.sampled_from(["user", "push", "uninstall"]),
    )
    form = st.fixed_dictionaries(
        {
            "campaign_id": st.one_of(st.just(ctx.campaign_id), TEXT).map(lambda t: (None, _raw(t))),
            "file": TEXT.map(lambda t: ("u.csv", b"User\n" + _raw(t) + b"\n", "text/csv")),
        },
        optional={
            "send_at": TEXT.map(lambda t: (None, _raw(t))),
            "messages": TEXT.map(lambda t: (None, _raw(t))),
        },
    )
    return st.one_of(
        json_call(
            "POST",
            st.sampled_from(["/users/sign_in", "/users/sign_in.json"]),
            st.one_of(
                st.fixed_dictionaries(
                    {"user": st.fixed_dictionaries({"email": JSON_VALUE, "password": JSON_VALUE})}
                ),
                st.dictionaries(TEXT, JSON_VALUE, max_size=2),
            ),
            st.just({}),
        ),
        st.builds(lambda h: Call("DELETE", "/users/sign_out", headers=h), auth),
        json_call(
            "POST",
            st.just("/api/campaigns/trigger"),
            trigger_body,
            st.fixed_dictionaries(
                {"Authorization": bearer.map(_header)},
                optional={"Idempotency-Key": TEXT.map(_header)},
            ),
        ),
        st.builds(
            lambda f, h: Call("POST", "/api/campaigns/trigger", headers=h, files=f), form, auth
        ),
        st.builds(
            lambda r, h: Call("PUT", f"/api/campaigns/request/{_segment(r)}/cancel", headers=h),
            TEXT,
            auth,
        ),
        st.builds(
            lambda c, q, h: Call(
                "GET", f"/api/campaigns/{_segment(c)}/request/scheduled", query=q, headers=h
            ),
            _either(ctx.campaign_id),
            st.dictionaries(st.sampled_from(["limit", "offset"]), TEXT, max_size=2),
            auth,
        ),
        st.builds(
            lambda q, h: Call("GET", "/api/campaigns/report", query=q, headers=h),
            st.dictionaries(st.sampled_from(["request_id", "request_id[]", "x"]), TEXT),
            auth,
        ),
        st.builds(
            lambda k, q: Call("GET", f"/files/reports/{_segment(k)}", query=q),
            TEXT,
            st.fixed_dictionaries({"expires": TEXT, "signature": TEXT}),
        ),
        json_call(
            "POST",
            app_id.map(lambda a: f"/api/apps/{_segment(a)}/devices"),
            st.fixed_dictionaries({"device_id": JSON_VALUE}, optional={"push_token": JSON_VALUE}),
            sdk,
        ),
        json_call(
            "PUT",
            device_paths,
            st.fixed_dictionaries(
                {},
                optional={
                    "user_id": JSON_VALUE,
                    "identity_hash": JSON_VALUE,
                    "opted_in": JSON_VALUE,
                },
            ),
            sdk,
        ),
        st.builds(
            lambda p, h: Call("DELETE", p, headers=h),
            st.builds(
                lambda a, d: f"/api/apps/{_segment(a)}/devices/{_segment(d)}/user",
                app_id,
                device_id,
            ),
            sdk,
        ),
        st.builds(
            lambda q, h: Call("GET", "/api/inapp/messages", query=q, headers=h),
            st.fixed_dictionaries(
                {"device_id": device_id},
                optional={"app_id": app_id, "limit": TEXT, "cursor": TEXT},
            ),
            sdk,
        ),
    )


def _fuzz(server: Server, ctx: Context) -> Counter[int]:
    statuses: Counter[int] = Counter()
    routes: Counter[str] = Counter()
    failures: list[str] = []
    with httpx.Client(base_url=server.url, timeout=60) as client:

        @given(call=_routes(ctx))
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        def run(call: Call) -> None:
            headers = dict(call.headers)
            if call.path == "/users/sign_out" and headers["Authorization"] == _header(
                f"Bearer {ctx.token}"
            ):
                headers["Authorization"] = f"Bearer {ctx.fresh_token()}".encode()
            answer = client.request(
                call.method,
                call.url(),
                headers={name.encode("ascii"): value for name, value in headers.items()},
                content=call.body,
                files=call.files,
            )
            statuses[answer.status_code] += 1
            routes[f"{call.method} {call.path.split('/')[1:4]}"] += 1
            if answer.status_code >= 500:
                failures.append(f"{answer.status_code} {call}: {answer.text[:200]}")
            if answer.status_code >= 400:
                assert answer.headers["content-type"] == "application/json", call
                body = answer.json()
                assert set(body) == {"error_message"}, (call, body)
                assert isinstance(body["error_message"], str)

        run()
    print(f"\ncalls per route: {dict(routes)}")
    assert failures == [], failures[:5]
    return statuses


def _context(server: Server, tenant: Tenant) -> Context:
    app = tenant_app(tenant)
    with httpx.Client(base_url=server.url, timeout=30) as client:
        secret = register(client, app, "fuzz-device", "fuzz-token")
    with session_scope() as session:
        owner = session.exec(
            select(Account).where(Account.email == tenant.emails[Role.owner])
        ).one()

    def fresh_token() -> str:
        return issue_token(settings=get_settings(), account=owner)

    return Context(
        tenant.tokens[Role.owner], fresh_token, app, "fuzz-device", secret, tenant.started
    )


def test_no_route_answers_5xx_to_any_unicode_on_sqlite(api_server: Server) -> None:
    statuses = _fuzz(api_server, _context(api_server, make_tenant()))
    print(f"\n{sum(statuses.values())} fuzzed calls (SQLite): {dict(sorted(statuses.items()))}")
    assert sum(statuses.values()) >= EXAMPLES
    assert statuses[400] > 0
    assert statuses[401] > 0


@pytest.fixture
def postgres_server(
    postgres_url: str, session_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Server, Callable[[], Tenant]]]:
    """An API process on a fresh PostgreSQL database (tenants made there too)."""
    upgrade(postgres_url)
    monkeypatch.setenv("CT_DATABASE_URL", postgres_url)
    get_settings.cache_clear()
    server = start_api_server(session_dir, CT_DATABASE_URL=postgres_url)
    try:
        yield server, make_tenant
    finally:
        server.process.stop()
        monkeypatch.delenv("CT_DATABASE_URL")
        get_settings.cache_clear()


@pytest.mark.postgres
def test_no_route_answers_5xx_to_any_unicode_on_postgres(
    postgres_server: tuple[Server, Callable[[], Tenant]],
) -> None:
    server, new_tenant = postgres_server
    statuses = _fuzz(server, _context(server, new_tenant()))
    print(f"\n{sum(statuses.values())} fuzzed calls (PostgreSQL): {dict(sorted(statuses.items()))}")
    assert sum(statuses.values()) >= EXAMPLES
