"""``uvicorn campaign_trigger.api.main:app``: the application of a server process
(:func:`~campaign_trigger.api.app.serve_app`), built once at import."""

from __future__ import annotations

from campaign_trigger.api.app import serve_app

app = serve_app()
