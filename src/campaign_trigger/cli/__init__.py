"""The ``campaign-trigger`` command: the embedded stack, its parts, and tenant admin.

Each group of commands is a module of this package; importing it adds its commands.
"""

from __future__ import annotations

import typer
from pydantic import ValidationError

from campaign_trigger import heap
from campaign_trigger.cli import admin, deployments, operations, stack
from campaign_trigger.cli.base import app

__all__ = ["admin", "app", "deployments", "main", "operations", "stack"]


def _settings_errors(exc: ValidationError) -> str:
    """The reasons a settings error gives, without pydantic's decorations."""
    return "; ".join(str(error["msg"]).removeprefix("Value error, ") for error in exc.errors())


def main() -> None:
    heap.starting()  # a command's imports (a server's modules): fewer collector passes
    try:
        app(prog_name="campaign-trigger")
    except ValidationError as exc:  # a bad setting (CT_...): its reason, not a traceback
        typer.echo(f"error: {_settings_errors(exc)}", err=True)
        raise SystemExit(1) from None
