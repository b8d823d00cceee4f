"""``campaign-trigger admin create-campaign`` and ``update-campaign``: a campaign's
templates and push options (``services/campaign_content.py``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, NoReturn

import typer

if TYPE_CHECKING:
    from sqlmodel import Session

InSession = Callable[[Callable[["Session"], Any]], Any]

Data = Annotated[
    list[str] | None,
    typer.Option(
        "--data",
        help="KEY=TEMPLATE, repeatable: custom data rendered per user, e.g. "
        "link=app://orders/{{ order_id }}.",
    ),
]
Image = Annotated[str | None, typer.Option(help="Image URL (https://, may hold {{ vars }}).")]
Sound = Annotated[str | None, typer.Option(help="Sound file name; default: the default sound.")]
Badge = Annotated[int | None, typer.Option(help="Badge number (iOS badge, Android count).")]
Priority = Annotated[str | None, typer.Option(help="high (default) or normal.")]
Ttl = Annotated[
    int | None,
    typer.Option("--ttl", help="Seconds a push may wait for an offline device; in-app expiry."),
]
Level = Annotated[
    str | None,
    typer.Option(help="APNs interruption level: passive, active, time-sensitive, critical."),
]
Thread = Annotated[str | None, typer.Option(help="APNs thread-id (notification grouping).")]
Category = Annotated[
    str | None, typer.Option(help="APNs category / Android click_action (tap actions).")
]


def parse_data(items: list[str] | None, fail: Callable[[str], NoReturn]) -> dict[str, str] | None:
    """``KEY=TEMPLATE`` items as a mapping (None if none were given)."""
    if items is None:
        return None
    data: dict[str, str] = {}
    for item in items:
        key, sep, template = item.partition("=")
        if not sep or not key:
            fail(f"--data takes KEY=TEMPLATE, not {item!r}")
        if key in data:
            fail(f"--data key {key!r} given twice")
        data[key] = template
    return data


def options(**given: Any) -> dict[str, Any]:
    """The options the operator gave (None: not given)."""
    return {name: value for name, value in given.items() if value is not None}


def register(
    admin: typer.Typer,
    *,
    in_session: InSession,
    say: Callable[[str], None],
    fail: Callable[[str], NoReturn],
) -> None:
    """Add the campaign content commands to ``admin``."""

    @admin.command("create-campaign")
    def create_campaign(
        org: Annotated[str, typer.Option("--org")],
        app_id: Annotated[list[str], typer.Option("--app-id", help="Repeat for several apps.")],
        channel: Annotated[str, typer.Option("--channel", help="push or inapp.")],
        title: Annotated[str, typer.Option("--title")] = "",
        body: Annotated[str, typer.Option("--body")] = "",
        campaign_id: Annotated[str | None, typer.Option("--campaign-id")] = None,
        data: Data = None,
        image: Image = None,
        sound: Sound = None,
        badge: Badge = None,
        priority: Priority = None,
        ttl: Ttl = None,
        interruption_level: Level = None,
        thread_id: Thread = None,
        category: Category = None,
        silent: Annotated[
            bool, typer.Option("--silent", help="Background push / data-only: shows nothing.")
        ] = False,
    ) -> None:
        """Create a draft API-trigger campaign; prints its id last."""
        from campaign_trigger.services import admin as service

        given = options(
            data=parse_data(data, fail),
            image=image,
            sound=sound,
            badge=badge,
            priority=priority,
            ttl_seconds=ttl,
            interruption_level=interruption_level,
            thread_id=thread_id,
            category=category,
            silent=silent or None,
        )
        campaign = in_session(
            lambda s: service.create_campaign(
                session=s,
                org_name=org,
                app_ids=app_id,
                channel=channel,
                title=title,
                body=body,
                campaign_id=campaign_id,
                options=given,
            )
        )
        variables = ", ".join(campaign.variables) or "none"
        say(f"Created draft campaign (variables: {variables}): {campaign.id}")

    @admin.command("update-campaign")
    def update_campaign(
        campaign_id: str,
        title: Annotated[str | None, typer.Option("--title")] = None,
        body: Annotated[str | None, typer.Option("--body")] = None,
        data: Data = None,
        image: Image = None,
        sound: Sound = None,
        badge: Badge = None,
        priority: Priority = None,
        ttl: Ttl = None,
        interruption_level: Level = None,
        thread_id: Thread = None,
        category: Category = None,
        silent: Annotated[
            bool | None, typer.Option("--silent/--alert", help="Background push, or not.")
        ] = None,
    ) -> None:
        """Change a draft campaign; an empty value ('') clears an option, --data replaces
        all the data."""
        from campaign_trigger.services import admin as service

        changes = options(
            title=title,
            body=body,
            data=parse_data(data, fail),
            image=image,
            sound=sound,
            badge=badge,
            priority=priority,
            ttl_seconds=ttl,
            interruption_level=interruption_level,
            thread_id=thread_id,
            category=category,
            silent=silent,
        )
        campaign = in_session(
            lambda s: service.update_campaign(session=s, campaign_id=campaign_id, changes=changes)
        )
        variables = ", ".join(campaign.variables) or "none"
        say(f"Updated draft campaign {campaign.id} (variables: {variables}).")
