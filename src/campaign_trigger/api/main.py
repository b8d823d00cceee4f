"""``uvicorn campaign_trigger.api.main:app``: the application built once at import."""

from __future__ import annotations

from campaign_trigger.api.app import create_app

app = create_app()
