"""The trigger API of the spec: create, cancel, scheduled list, report."""

from __future__ import annotations

from typing import Annotated, Any

from anyio import to_thread
from fastapi import APIRouter, Header, Path, Query, Request
from fastapi.responses import Response

from campaign_trigger.api.deps import QuotaAccount, Sender, SessionDep, SettingsDep, StorageDep
from campaign_trigger.api.limits import json_body_limit
from campaign_trigger.api.responses import QUOTA_HEADERS, errors
from campaign_trigger.api.uploads import (
    PLAIN_BODY,
    media_type,
    read_form_input,
    read_json_input,
)
from campaign_trigger.config import Settings
from campaign_trigger.errors import InvalidInput
from campaign_trigger.schemas.api import (
    Reports,
    RequestCreated,
    RequestOut,
    ScheduledList,
    TriggerForm,
    TriggerJson,
)
from campaign_trigger.schemas.preview import TriggerPreview
from campaign_trigger.services import lifecycle
from campaign_trigger.services.preview import scratch_storage
from campaign_trigger.services.request_views import request_body, scheduled_page
from campaign_trigger.services.requests import create_request, preview_request
from campaign_trigger.services.trigger_input import (
    EMPTY_CAMPAIGN_ID,
    TriggerInput,
    check_campaign_id,
)
from campaign_trigger.store.files import Storage, upload_key
from campaign_trigger.store.models import new_id

router = APIRouter(prefix="/api/campaigns", tags=["campaigns"])

NO_REQUEST_ID = "You must provide a request_id"
REQUEST_ID_NOT_STRING = "Request identifier must be a String"
BAD_DRY_RUN = "dry_run must be true or false"
MAX_IDEMPOTENCY_KEY = 200


def _ok(model: type[Any], description: str, **headers: Any) -> dict[int | str, Any]:
    return {
        200: {"model": model, "description": description, "headers": {**QUOTA_HEADERS, **headers}}
    }


BODY_MODELS = (TriggerJson, TriggerForm)
_TRIGGER_BODY = {
    "requestBody": {
        "required": True,
        "content": {
            "application/json": {"schema": {"$ref": "#/components/schemas/TriggerJson"}},
            "multipart/form-data": {
                "schema": {"$ref": "#/components/schemas/TriggerForm"},
                "encoding": {"file": {"contentType": "text/csv"}},
            },
        },
    }
}


def _dry_run(request: Request) -> bool:
    """The ``dry_run`` query parameter: absent, ``true`` or ``false`` exactly (else 400)."""
    values = request.query_params.getlist("dry_run")
    if not values:
        return False
    if len(values) > 1 or values[0] not in ("true", "false"):
        raise InvalidInput(BAD_DRY_RUN)
    return values[0] == "true"


async def _read_trigger(
    request: Request,
    *,
    settings: Settings,
    storage: Storage,
    request_id: str,
    idempotency_key: str | None,
) -> TriggerInput:
    """The call's body: JSON messages, or a form whose CSV file is streamed to ``storage``."""
    kind = media_type(request)
    cap = settings.json_messages_cap
    if kind == "application/json" or kind.endswith("+json"):
        return await read_json_input(request, cap=cap, idempotency_key=idempotency_key)
    if kind == "multipart/form-data":
        return await read_form_input(
            request,
            storage=storage,
            key=upload_key(request_id),
            max_bytes=settings.max_upload_bytes,
            messages_bytes=json_body_limit(settings),
            cap=cap,
            idempotency_key=idempotency_key,
        )
    raise InvalidInput(PLAIN_BODY)


@router.post(
    "/trigger",
    response_model=RequestCreated | TriggerPreview,
    responses={
        200: {
            "description": "The request is accepted (`RequestCreated`); with `dry_run=true`, "
            "its preview (`TriggerPreview`)",
            "headers": QUOTA_HEADERS,
        },
        **errors(400, 401, 403, 409, 413, 429),
    },
    openapi_extra=_TRIGGER_BODY,
)
async def create_trigger_request(
    request: Request,
    identity: Sender,
    session: SessionDep,
    settings: SettingsDep,
    storage: StorageDep,
    idempotency_key: Annotated[
        str | None,
        Header(
            description="Repeat a call safely: the same key and body return the first "
            "request's id and create nothing. An empty or blank key counts as none. Ignored "
            "by a dry run.",
            max_length=MAX_IDEMPOTENCY_KEY,
        ),
    ] = None,
    dry_run: Annotated[
        str | None,
        Query(
            description="`true`: preview the call instead (see above); nothing is stored, "
            "scheduled or sent. Only `true` or `false`.",
            json_schema_extra={"enum": ["true", "false"]},
        ),
    ] = None,
) -> RequestCreated | TriggerPreview:
    """Create a request: JSON messages, or a CSV file as multipart form-data.

    The CSV file goes under the form key `file`: a file under any other key is not
    read (the call answers `Must provide JSON messages or a CSV file`), and a second file
    under `file` is refused (`Must provide either JSON messages or a CSV file`).

    Besides the specification's refusals: with `CT_REQUIRE_APP_CREDENTIALS` on
    (production), a push campaign with an app that has no provider credentials is
    refused with 400 `App <app_id> has no push provider credentials: ...`.

    **Dry run** (`?dry_run=true`, same body): every check of a create runs, and the
    answer is exactly the refusal a create would give, or 200 with a `TriggerPreview`:
    `message_count`; `users_without_device`; `apps` (per app of the campaign: its
    `platform`, the messages' users' `devices`, how many a message goes `to_send`, and
    `not_sent` per pre-send outcome); `devices_per_platform`; `messages` (the first 20,
    each `rendered` per platform: `title`, `body` and the provider `payload` as the
    delivery code builds it, with its `payload_bytes`); and `payload_errors` (the first
    20 payloads a provider would refuse: over its 4 KB limit, or not serialisable) with
    their `payload_error_count` over all messages. Nothing is stored, scheduled or sent;
    an uploaded file is kept only while it is checked. A preview takes one unit of the
    quota, like a create. Any other `dry_run` value than `true` or `false` is a 400.
    """
    if _dry_run(request):
        with scratch_storage(settings) as scratch:
            trigger = await _read_trigger(
                request,
                settings=settings,
                storage=scratch,
                request_id=new_id(),
                idempotency_key=None,
            )
            return await to_thread.run_sync(
                lambda: preview_request(
                    session=session,
                    settings=settings,
                    storage=storage,
                    scratch=scratch,
                    org_id=identity.org_id,
                    trigger=trigger,
                )
            )
    request_id = new_id()
    trigger = await _read_trigger(
        request,
        settings=settings,
        storage=storage,
        request_id=request_id,
        # A blank key is no key: stored, it would replay its first request for any body.
        idempotency_key=idempotency_key if idempotency_key and idempotency_key.strip() else None,
    )
    created = await to_thread.run_sync(
        lambda: create_request(
            session=session,
            settings=settings,
            storage=storage,
            org_id=identity.org_id,
            request_id=request_id,
            trigger=trigger,
        )
    )
    return RequestCreated(request_id=created)


@router.put(
    "/request/{request_id}/cancel",
    response_model=RequestOut,
    responses={
        **_ok(RequestOut, "The request as created, now cancelled"),
        **errors(400, 401, 403, 404, 429, 503),
    },
)
async def cancel_trigger_request(
    request_id: Annotated[str, Path(description="The request to cancel.")],
    identity: Sender,
    session: SessionDep,
    settings: SettingsDep,
) -> Response:
    """Cancel a request that has not started; returns the request as created."""
    if not request_id.strip():
        raise InvalidInput(NO_REQUEST_ID)
    cancelled = await lifecycle.cancel_request(
        session=session, org_id=identity.org_id, request_id=request_id
    )
    body = await to_thread.run_sync(
        lambda: request_body(session=session, settings=settings, request=cancelled)
    )
    # JSON text in RequestOut's shape, numbers as the body wrote them (see request_body)
    return Response(body, media_type="application/json")


@router.get(
    "/{campaign_id}/request/scheduled",
    response_model=ScheduledList,
    responses={
        **_ok(
            ScheduledList,
            "One page of the campaign's scheduled requests",
            **{
                "X-Total-Count": {
                    "description": "Scheduled requests in all pages.",
                    "schema": {"type": "integer"},
                }
            },
        ),
        **errors(400, 401, 404, 429, 503),
    },
)
async def read_scheduled_requests(
    campaign_id: Annotated[str, Path(description="The campaign.")],
    identity: QuotaAccount,
    session: SessionDep,
    settings: SettingsDep,
    limit: Annotated[int, Query(ge=1, le=100, description="Page size.")] = 50,
    offset: Annotated[int, Query(ge=0, le=10**9, description="Requests to skip.")] = 0,
    after: Annotated[
        str | None,
        Query(
            max_length=64,
            description=(
                "Start after this request: the last request_id of the page before. Such "
                "pages do not shift when a request of an earlier page starts or is "
                "cancelled meanwhile (an offset does); `offset` then counts from it."
            ),
        ),
    ] = None,
) -> Response:
    """List a campaign's scheduled requests, soonest first."""
    check_campaign_id(campaign_id)  # a blank one: Empty campaign identifier
    if after is not None and not after.strip():
        raise InvalidInput(NO_REQUEST_ID)
    requests, total = await lifecycle.scheduled_requests(
        session=session,
        org_id=identity.org_id,
        campaign_id=campaign_id,
        limit=limit,
        offset=offset,
        after=after,
    )
    page = await to_thread.run_sync(
        lambda: scheduled_page(
            session=session, settings=settings, campaign_id=campaign_id, requests=requests
        )
    )
    # Built as JSON text in the model's shape: a page of up to 100 x 1,000 messages is
    # neither validated again against ScheduledList on the way out (FastAPI's default)
    # nor decoded and encoded again (see scheduled_page).
    return Response(page, media_type="application/json", headers={"X-Total-Count": str(total)})


@router.put("/request//cancel", include_in_schema=False)
async def cancel_without_request_id(_identity: Sender) -> None:
    """An empty request id segment: refused as a blank one, not 404."""
    raise InvalidInput(NO_REQUEST_ID)


@router.get("//request/scheduled", include_in_schema=False)
async def read_scheduled_without_campaign_id(_identity: QuotaAccount) -> None:
    """An empty campaign id segment: refused as a blank one, not 404."""
    raise InvalidInput(EMPTY_CAMPAIGN_ID)


def _request_id_param(request: Request) -> str:
    """The single ``request_id`` query parameter (spec messages when absent or not a string)."""
    params = request.query_params
    values = params.getlist("request_id")
    array_style = any(k.startswith("request_id[") for k in params)
    if len(values) > 1 or array_style:
        raise InvalidInput(REQUEST_ID_NOT_STRING)
    if not values or not values[0].strip():
        raise InvalidInput(NO_REQUEST_ID)
    return values[0]


@router.get(
    "/report",
    response_model=Reports,
    responses={
        **_ok(Reports, "Links to the request's CSV reports, valid 1 hour"),
        **errors(400, 401, 429, 503),
    },
)
async def read_report(
    request: Request,
    identity: QuotaAccount,
    session: SessionDep,
    settings: SettingsDep,
    request_id: Annotated[str | None, Query(description="The request.")] = None,
) -> Reports:
    """Get links to a processed request's report files."""
    wanted = _request_id_param(request)
    links = await lifecycle.report_links(
        session=session, settings=settings, org_id=identity.org_id, request_id=wanted
    )
    return Reports(request_id=wanted, reports=links)
