"""Headers, keys and files through the real server: nosniff on every answer, no-store
on the token and on signed downloads, the OpenAPI pages' assets served by the service,
token and link keys derived apart from a secret of 32 bytes at least, and every file
of the service's home readable by its user only, whatever the umask."""

from __future__ import annotations

import hashlib
import hmac
import os
import re
import stat
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from api_tenants import PASSWORD, Server, Tenant
from pydantic import SecretStr

from campaign_trigger.config import Settings, get_settings
from campaign_trigger.services import reports
from campaign_trigger.services.auth import issue_token
from campaign_trigger.services.signing import signed_url
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import get_storage, report_key
from campaign_trigger.store.models import Account, Role
from support import VENV_BIN, ManagedProcess, free_port, wait_http

STATIC_CACHE = "public, max-age=86400"


@pytest.fixture
def http(api_server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=api_server.url, timeout=30) as client:
        yield client


# --- headers -------------------------------------------------------------------------


def test_every_answer_says_nosniff_and_none_but_static_assets_is_stored(
    http: httpx.Client, tenant: Tenant
) -> None:
    sign_in = {"user": {"email": tenant.emails[Role.member], "password": PASSWORD}}
    answers = {
        "health": http.get("/health"),
        "openapi": http.get("/openapi.json"),
        "docs": http.get("/docs"),
        "redoc": http.get("/redoc"),
        "token": http.post("/users/sign_in", json=sign_in),
        "wrong password": http.post(
            "/users/sign_in", json={"user": {"email": "x@y.z", "password": "no"}}
        ),
        "no token": http.get("/api/campaigns/report", params={"request_id": "x"}),
        "list": http.get(
            f"/api/campaigns/{tenant.started}/request/scheduled", headers=tenant.auth()
        ),
        "bad input": http.post("/api/campaigns/trigger", json={}, headers=tenant.auth()),
        "unknown route": http.get("/nowhere"),
        "wrong method": http.delete("/health"),
        "too large": http.post("/users/sign_in", content=b"x" * 10_000),
        "bad link": http.get("/files/reports/x.csv", params={"expires": 1, "signature": "0"}),
    }
    for name, answer in answers.items():
        assert answer.headers.get("x-content-type-options") == "nosniff", name
        assert answer.headers.get("cache-control") == "no-store", name
        assert answer.headers.get("referrer-policy") == "no-referrer", name
    assert answers["token"].status_code == 200
    asset = http.get("/static/swagger-ui/swagger-ui.css")
    assert asset.headers["x-content-type-options"] == "nosniff"
    assert asset.headers["cache-control"] == STATIC_CACHE


def test_a_signed_download_is_not_stored(http: httpx.Client, tenant: Tenant) -> None:
    settings = get_settings()
    summary = _write_reports(
        settings=settings, request_id=uuid.uuid4().hex, campaign_id="c", app_ids=["a"]
    )
    link = signed_url(settings=settings, path=f"/files/{summary.report_paths[0]}")
    download = http.get(httpx.URL(link).raw_path.decode())
    assert download.status_code == 200
    assert download.headers["cache-control"] == "no-store"
    assert download.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_the_openapi_pages_load_every_asset_from_the_service(http: httpx.Client, page: str) -> None:
    answer = http.get(page)
    policy = answer.headers["content-security-policy"]
    assert "default-src 'self'" in policy  # the browser asks no other origin for anything
    assert "img-src 'self' data:" in policy
    html = answer.text
    assert not re.search(r"https?://|//cdn|fonts\.googleapis", html), html
    assets = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert assets, html
    kinds = {".js": "javascript", ".css": "text/css", ".png": "image/png"}
    for asset in assets:
        assert asset.startswith("/static/"), asset
        answer = http.get(asset)
        assert answer.status_code == 200, asset
        assert kinds[Path(asset).suffix] in answer.headers["content-type"], asset
        assert len(answer.content) > 500, asset
    assert http.get("/openapi.json").json()["info"]["title"] == "campaign-trigger"


# --- keys ----------------------------------------------------------------------------


def _member(tenant: Tenant) -> Account:
    with session_scope() as session:
        return session.get(
            Account,
            int(jwt.decode(tenant.tokens[Role.member], options={"verify_signature": False})["sub"]),
        )  # type: ignore[return-value]


def test_tokens_and_links_are_signed_with_keys_of_their_own(
    http: httpx.Client, tenant: Tenant
) -> None:
    settings = get_settings()
    secret = os.environ["CT_SECRET_KEY"]
    assert len({secret.encode(), settings.token_key(), settings.link_key()}) == 3
    listing = f"/api/campaigns/{tenant.started}/request/scheduled"
    claims = jwt.decode(tenant.tokens[Role.member], options={"verify_signature": False})
    for key in (secret, settings.link_key()):
        forged = jwt.encode(claims, key, algorithm="HS256")
        refused = http.get(listing, headers={"Authorization": f"Bearer {forged}"})
        assert refused.status_code == 401
    good = issue_token(settings=settings, account=_member(tenant))
    assert http.get(listing, headers={"Authorization": f"Bearer {good}"}).status_code == 200

    key = report_key(uuid.uuid4().hex, "a")
    _write_reports(settings=settings, request_id=key.split("/")[1], campaign_id="c", app_ids=["a"])
    expires = int(time.time()) + 600
    path = f"/files/{key}"
    for signing_key in (secret.encode(), settings.token_key()):
        signature = hmac.new(signing_key, f"{path}\n{expires}".encode(), hashlib.sha256)
        params: dict[str, Any] = {"expires": expires, "signature": signature.hexdigest()}
        assert http.get(path, params=params).status_code == 403
    assert (
        http.get(httpx.URL(signed_url(settings=settings, path=path)).raw_path.decode()).status_code
        == 200
    )


def test_a_short_secret_key_stops_the_start_with_its_reason(session_dir: Path) -> None:
    port = free_port()
    short = "only-20-bytes-secret"
    server = ManagedProcess(
        "api-short-key",
        [
            str(VENV_BIN / "uvicorn"),
            "--factory",
            "campaign_trigger.api.app:serve_app",
            "--port",
            str(port),
        ],
        env={"CT_SECRET_KEY": short},
        log_dir=session_dir,
    )
    try:
        assert server.popen.wait(timeout=60) != 0
    finally:
        server.stop()
    log = server.log_path.read_text()
    assert "CT_SECRET_KEY must be at least 32 bytes long (it has 20)" in log
    assert short not in log
    cli = subprocess.run(
        [str(VENV_BIN / "campaign-trigger"), "api"],
        env={**os.environ, "CT_SECRET_KEY": short, "CT_API_PORT": str(port)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert cli.returncode == 1
    assert cli.stderr.startswith("error: CT_SECRET_KEY must be at least 32 bytes long"), cli.stderr
    assert short not in cli.stderr + cli.stdout
    assert "Traceback" not in cli.stderr


# --- files ---------------------------------------------------------------------------


def _with_umask_0(argv: list[str]) -> list[str]:
    return ["sh", "-c", 'umask 000 && exec "$@"', "sh", *argv]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_home_s_files_are_private_from_their_creation(session_dir: Path) -> None:
    home = session_dir / f"private-home-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "CT_HOME": str(home), "CT_SECRET_KEY": ""}
    cli = str(VENV_BIN / "campaign-trigger")

    def admin(*args: str) -> str:
        done = subprocess.run(
            _with_umask_0([cli, "admin", *args]),
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout

    admin("create-org", "private")
    admin("create-account", "--org", "private", "--email", "p@x.io", "--password", PASSWORD)
    admin("create-app", "--org", "private", "--app-id", "private-app", "--platform", "ios")
    campaign = (
        admin(
            "create-campaign",
            "--org",
            "private",
            "--app-id",
            "private-app",
            "--channel",
            "push",
            "--title",
            "T",
            "--body",
            "B",
        )
        .strip()
        .rsplit(" ", 1)[-1]
    )
    admin("launch-campaign", campaign)
    port = free_port()
    server = ManagedProcess(
        "api-private-home",
        _with_umask_0(
            [
                str(VENV_BIN / "uvicorn"),
                "--factory",
                "campaign_trigger.api.app:serve_app",
                "--port",
                str(port),
            ]
        ),
        env={"CT_HOME": str(home), "CT_SECRET_KEY": "", "CT_API_RECONCILER": "false"},
        log_dir=session_dir,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/openapi.json", process=server)
        signed = httpx.post(
            f"{url}/users/sign_in", json={"user": {"email": "p@x.io", "password": PASSWORD}}
        )
        assert signed.status_code == 200, signed.text
        created = httpx.post(
            f"{url}/api/campaigns/trigger",
            headers={"Authorization": signed.headers["authorization"]},
            files={
                "campaign_id": (None, campaign),
                "send_at": (None, "2099-01-01T00:00:00+00:00"),
                "file": ("u.csv", b"User\nu1\n", "text/csv"),
            },
        )
        assert created.status_code == 200, created.text
        request_id = created.json()["request_id"]
        database = home / "campaign-trigger.db"
        shared = [p for p in (Path(f"{database}-wal"), Path(f"{database}-shm")) if p.exists()]
        assert shared, "the server's SQLite connection keeps its WAL files"
        storage = home / "storage"
        files = [
            home / "secret.key",
            database,
            *shared,
            storage / "uploads" / f"{request_id}.csv",
            storage / "messages" / f"{request_id}.arrow",
        ]
        for path in files:
            assert _mode(path) == 0o600, (path, oct(_mode(path)))
    finally:
        server.stop()
    settings = Settings(home=home, secret_key=SecretStr(""))
    old_umask = os.umask(0)
    try:  # a worker writing a report
        _write_reports(
            settings=settings,
            request_id=request_id,
            campaign_id=campaign,
            app_ids=["private-app"],
        )
    finally:
        os.umask(old_umask)
    report = Path(get_storage(settings).path(report_key(request_id, "private-app")))
    assert _mode(report) == 0o600
    for folder in (
        home,
        home / "storage",
        home / "storage" / "uploads",
        home / "storage" / "messages",
        report.parent,
        report.parent.parent,
    ):
        assert _mode(folder) == 0o700, (folder, oct(_mode(folder)))
    assert not list(home.glob("secret*.tmp"))


def _write_reports(**kwargs: Any) -> reports.ReportSummary:
    with session_scope() as session:
        return reports.write_reports(session=session, **kwargs)
