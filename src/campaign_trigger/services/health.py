"""The state of each part the service needs: ``GET /health`` and ``campaign-trigger status``.

Three parts it cannot serve without — the database, the storage of uploads and reports,
the Prefect server — and the push providers, without which it still accepts requests
(their messages then fail with ``FPErrPushFailed``). :func:`check` answers ``status``:
``ok``, ``degraded`` (a provider unreachable) or ``down`` (a part it needs, named in
``down``; the API then answers 503).

``GET /health`` needs no authentication, so it answers :func:`public`: which part is down,
not why nor where (error texts name database hosts and users, the storage and Prefect
URLs); the reasons go to the API's log (:func:`log_reasons`) and to ``campaign-trigger
status``, which reads :func:`check` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from typing import Any, Final
from urllib.parse import urlsplit

import httpx
from sqlalchemy import text

from campaign_trigger import __version__
from campaign_trigger.config import Settings
from campaign_trigger.store.db import get_engine
from campaign_trigger.store.files import get_storage

logger = logging.getLogger(__name__)

OK: Final = "ok"
UNREACHABLE: Final = "unreachable"
NEEDED: Final = ("database", "storage", "prefect")
CHECK_SECONDS: Final = 2.0


def _why(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().removesuffix(":")[:300]


def database() -> str | None:
    """None when ``SELECT 1`` works, else why not."""
    try:
        with get_engine().connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:
        return _why(exc)
    return None


def storage(settings: Settings) -> str | None:
    """None when a file can be written to and removed from the storage root, else why not.
    A missing root is down: it is not made here (a wrong URL would look healthy)."""
    store = get_storage(settings)
    probe = f"{store.root}/.health-{uuid.uuid4().hex}"
    try:
        if not store.fs.isdir(store.root):
            return f"{settings.storage_url} is not a folder"
        with store.fs.open(probe, "wb") as handle:
            handle.write(b"ok")
        store.fs.rm(probe)
    except Exception as exc:
        return _why(exc)
    return None


async def prefect() -> str | None:
    """None when the Prefect server's ``/health`` answers 200, else why not."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return "PREFECT_API_URL is not set"
    try:
        async with httpx.AsyncClient(timeout=CHECK_SECONDS) as client:
            response = await client.get(f"{url.rstrip('/')}/health")
    except httpx.HTTPError as exc:
        return f"{url}: {_why(exc)}"
    if response.status_code != 200:
        return f"{url}: HTTP {response.status_code}"
    return None


async def reachable(url: str) -> str:
    """ "ok" when a TCP connection to ``url``'s host and port is accepted, else why not."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    try:
        async with asyncio.timeout(CHECK_SECONDS):
            _, writer = await asyncio.open_connection(parts.hostname, port)
    except TimeoutError:
        return f"no answer from {parts.hostname}:{port} in {CHECK_SECONDS:.0f} s"
    except OSError as exc:
        why = os.strerror(exc.errno) if exc.errno else str(exc) or type(exc).__name__
        return f"{why} ({parts.hostname}:{port})"
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return OK


async def providers(settings: Settings) -> dict[str, dict[str, str]]:
    """Whether this process can reach the push providers it would send to (the sandbox
    when no credentials are configured): FCM with its token endpoint, and APNs."""
    fcm, fcm_token, apns = await asyncio.gather(
        reachable(settings.fcm_base_url),
        reachable(settings.fcm_token_uri),
        reachable(settings.apns_base_url),
    )
    fcm_error = next((e for e in (fcm, fcm_token) if e != OK), None)
    return {
        "fcm": _provider_state(settings.fcm_base_url, fcm_error),
        "apns": _provider_state(settings.apns_base_url, None if apns == OK else apns),
    }


def _provider_state(url: str, error: str | None) -> dict[str, str]:
    if error is None:
        return {"status": OK, "url": url}
    return {"status": UNREACHABLE, "url": url, "error": error}


async def check(settings: Settings) -> dict[str, Any]:
    """Every part's state: ``status``, each needed part (``ok`` / ``unreachable``),
    ``down`` (the needed parts that are not ok) with ``errors`` (why), ``providers``."""
    database_error, storage_error, prefect_error, provider_states = await asyncio.gather(
        asyncio.to_thread(database),
        asyncio.to_thread(storage, settings),
        prefect(),
        providers(settings),
    )
    errors = {
        part: error
        for part, error in zip(NEEDED, (database_error, storage_error, prefect_error), strict=True)
        if error is not None
    }
    providers_ok = all(p["status"] == OK for p in provider_states.values())
    status = "down" if errors else (OK if providers_ok else "degraded")
    return {
        "status": status,
        **{part: UNREACHABLE if part in errors else OK for part in NEEDED},
        "down": list(errors),
        "errors": errors,
        "providers": provider_states,
        "version": __version__,
    }


def public(report: dict[str, Any]) -> dict[str, Any]:
    """What ``GET /health`` answers anyone: each part's state, without the reasons nor
    the providers' URLs."""
    return {
        **{key: value for key, value in report.items() if key != "errors"},
        "providers": {
            name: {"status": state["status"]} for name, state in report["providers"].items()
        },
    }


_reasons_logged: dict[str, str] = {}


def log_reasons(report: dict[str, Any]) -> None:
    """Log why a part is down or a provider unreachable, when that changed since this
    process last logged it (a probe every few seconds would repeat it)."""
    reasons = dict(report["errors"])
    reasons.update(
        (name, f"{state['url']}: {state['error']}")
        for name, state in report["providers"].items()
        if "error" in state
    )
    if reasons == _reasons_logged:
        return
    _reasons_logged.clear()
    _reasons_logged.update(reasons)
    for part, reason in reasons.items():
        logger.warning("health: %s unreachable: %s", part, reason)
    if not reasons:
        logger.info("health: every part ok")
