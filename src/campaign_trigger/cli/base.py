"""The root of the ``campaign-trigger`` command and what its commands share: printing,
refusing (exit 1 with one line), migrating, and one transaction per admin command."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, TypeVar

import typer

from campaign_trigger.config import get_settings
from campaign_trigger.errors import CampaignTriggerError

if TYPE_CHECKING:
    from sqlmodel import Session

T = TypeVar("T")

app = typer.Typer(
    help="Campaign-trigger: API-trigger campaigns of push and in-app messages.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def say(text: str) -> None:
    typer.echo(text)


def fail(message: str) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(1)


def migrate() -> None:
    from campaign_trigger.store.migrate import upgrade

    upgrade(get_settings().database_url)


def in_session(action: Callable[[Session], T]) -> T:
    """Run ``action(session)`` in one transaction after migrating; map refusals to exit 1."""
    from campaign_trigger.store.db import session_scope

    try:
        migrate()
        with session_scope() as session:
            return action(session)
    except CampaignTriggerError as exc:
        fail(exc.message)
