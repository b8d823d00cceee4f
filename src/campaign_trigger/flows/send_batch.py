"""The ``send-batch`` flow: send a batch by hand (Prefect UI form), on a schedule, or from Python.

It goes through the same service as ``POST /api/campaigns/trigger``
(``services.requests.create_request``): the same checks in the same order, the same
error texts, the same stored request, the same ``deliver-request`` run, the same
report. It acts on behalf of the campaign's organisation and takes one unit of its
request quota, like an API call. A refused batch fails the run, with the spec's error
text in the run's state and in a markdown artifact (``send-batch-refused``).

Its parameters are one pydantic model, :class:`SendBatchInput`, so the Prefect UI
renders a form and the server rejects malformed input before a run starts; "exactly
one of ``messages`` / ``csv_path``" is in the JSON schema (``oneOf``) and is checked
again by the service, for calls from Python.

From Python::

    from campaign_trigger.flows import send_batch
    from campaign_trigger.flows.send_batch import SendBatchInput

    result = send_batch(SendBatchInput(campaign_id="demo-campaign", csv_path="in/b.csv"),
                        wait=True)
    result.reports      # signed links to the report files, once delivered
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import PurePosixPath

from fsspec.core import url_to_fs
from prefect import flow, get_client, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.client.schemas.objects import StateType
from prefect.context import FlowRunContext
from prefect.utilities.asyncutils import run_coro_as_sync
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue

from campaign_trigger.config import Settings, get_settings
from campaign_trigger.errors import CampaignTriggerError, InvalidInput, RequestStateError
from campaign_trigger.services import lifecycle, prefect_runs, quota, scheduling
from campaign_trigger.services.ingest import READ_ERROR, copy_to_storage
from campaign_trigger.services.requests import (
    MISSING,
    StoredUpload,
    TriggerInput,
    body_hash,
    create_request,
)
from campaign_trigger.store.db import session_scope
from campaign_trigger.store.files import Storage, get_storage, upload_key
from campaign_trigger.store.models import Campaign, Request, new_id

logger = logging.getLogger(__name__)

REFUSED_ARTIFACT_KEY = "send-batch-refused"
WAIT_POLL_SECONDS = 1.0

TemplateValue = str | int | float | bool | None


class Message(BaseModel):
    """One message: a user and the values of the campaign's template variables."""

    model_config = ConfigDict(extra="forbid")

    user_id: str = Field(
        min_length=1, max_length=200, description="The user to whom the message is sent."
    )
    template_variables: dict[str, TemplateValue] = Field(
        default_factory=dict,
        description='Template variable name to value for this user, e.g. {"first_name": "Ada"}. '
        "Every variable of the campaign's message must be given.",
    )


# "Exactly one of messages / csv_path", for the Prefect server's JSON-schema check
# (pydantic validators do not run there, nor in the UI form).
_EXACTLY_ONE_SOURCE: list[JsonValue] = [
    {
        "title": "JSON messages",
        "required": ["messages"],
        "properties": {"messages": {"type": "array"}, "csv_path": {"type": "null"}},
    },
    {
        "title": "CSV file",
        "required": ["csv_path"],
        "properties": {"csv_path": {"type": "string"}, "messages": {"type": "null"}},
    },
]


class SendBatchInput(BaseModel):
    """A batch for an API-trigger campaign: JSON messages or a CSV file in storage."""

    model_config = ConfigDict(
        extra="forbid",
        title="Batch",
        json_schema_extra={"oneOf": _EXACTLY_ONE_SOURCE},
    )

    campaign_id: str = Field(
        min_length=1,
        max_length=64,
        description="The campaign's identifier (Copy campaign ID in the console). "
        "The campaign must be started.",
    )
    send_at: AwareDatetime | None = Field(
        default=None,
        description="When to send, with a UTC offset; empty means now. "
        "At most 5 minutes in the past.",
    )
    messages: list[Message] | None = Field(
        default=None,
        description="The messages (about a hundred at most). Give these or a CSV file, not both.",
    )
    csv_path: str | None = Field(
        default=None,
        min_length=1,
        description="A CSV file in storage: a key under CT_STORAGE_URL "
        "(e.g. incoming/orders.csv) or a full URL under it; {date} stands for the run's "
        "scheduled day (YYYY-MM-DD). Header: User, then one column per template "
        "variable. Give this or messages, not both.",
    )


class SendBatchResult(BaseModel):
    """What a send-batch run returns."""

    request_id: str = Field(description="The request, as the HTTP API knows it.")
    reports: list[str] = Field(
        default_factory=list,
        description="Signed links to the report files (filled when run with wait=True).",
    )


@dataclass(frozen=True)
class _Accepted:
    request_id: str
    org_id: int
    campaign_id: str
    message_count: int


def _campaign_org(campaign_id: str) -> int | None:
    with session_scope() as session:
        campaign = session.get(Campaign, campaign_id) if len(campaign_id) <= 64 else None
        return campaign.org_id if campaign is not None else None


def _storage_key(storage: Storage, csv_path: str) -> str:
    """The key of ``csv_path`` under the storage root (a key, or a URL/path inside it)."""
    if "://" not in csv_path and not csv_path.startswith("/"):
        return csv_path.lstrip("./")
    fs, path = url_to_fs(csv_path)
    same_fs = type(fs) is type(storage.fs)
    root = storage.root.rstrip("/") + "/"
    if not same_fs or not path.startswith(root):
        raise InvalidInput(READ_ERROR.format(f"{csv_path} is not under the storage URL"))
    return str(path).removeprefix(root)


def csv_path_for_run(csv_path: str) -> str:
    """``{date}`` in ``csv_path`` becomes the run's scheduled day (UTC, ``YYYY-MM-DD``), so
    a daily schedule reads that day's file and never sends yesterday's again."""
    if "{date}" not in csv_path:
        return csv_path
    context = FlowRunContext.get()
    expected = context.flow_run.expected_start_time if context and context.flow_run else None
    day = (expected or datetime.now(UTC)).astimezone(UTC).date().isoformat()
    return csv_path.replace("{date}", day)


def _stage_upload(
    settings: Settings, storage: Storage, *, csv_path: str, request_id: str
) -> StoredUpload:
    """Copy the CSV file to the request's upload key, streaming; the API's upload twin."""
    key = _storage_key(storage, csv_path)
    try:
        source = storage.open(key, "rb")
    except (FileNotFoundError, IsADirectoryError, ValueError) as exc:
        raise InvalidInput(READ_ERROR.format(f"no file at {csv_path}")) from exc
    with source:
        writer = copy_to_storage(
            source,
            storage=storage,
            key=upload_key(request_id),
            max_bytes=settings.max_upload_bytes,
        )
    return StoredUpload(
        key=writer.key,
        filename=PurePosixPath(key).name,
        content_type="text/csv",
        head=writer.head,
        size=writer.size,
    )


def _consume_quota(org_id: int) -> None:
    with session_scope() as session:
        quota.consume(session=session, org_id=org_id)


@task(name="create-request", persist_result=False)
def create_batch_request(batch: SendBatchInput) -> _Accepted:
    """Check and store the batch as a request of the campaign's organisation."""
    settings = get_settings()
    storage = get_storage(settings)
    request_id = new_id()
    org_id = _campaign_org(batch.campaign_id) if batch.campaign_id.strip() else None
    if org_id is not None:
        _consume_quota(org_id)
    context = FlowRunContext.get()
    run_id = context.flow_run.id if context is not None and context.flow_run else None
    trigger = TriggerInput(
        # a retried or re-run flow run finds its request instead of making a second one
        idempotency_key=f"send-batch:{run_id}" if run_id else None,
        body_hash=body_hash(batch.model_dump(mode="json")) if run_id else None,
        campaign_id=batch.campaign_id,
        send_at=batch.send_at.isoformat() if batch.send_at is not None else None,
        messages=(
            [m.model_dump() for m in batch.messages] if batch.messages is not None else MISSING
        ),
    )
    if batch.csv_path is not None:
        if batch.messages is not None:  # both given: the service words the refusal
            trigger.file_member = True
        elif org_id is not None:
            trigger.upload = _stage_upload(
                settings,
                storage,
                csv_path=csv_path_for_run(batch.csv_path),
                request_id=request_id,
            )
        else:
            trigger.file_member = True  # the unknown campaign is refused first
    created = create_request(
        settings=settings,
        storage=storage,
        org_id=org_id if org_id is not None else -1,
        request_id=request_id,
        trigger=trigger,
    )
    with session_scope() as session:
        request = session.get(Request, created)
        count = request.message_count if request is not None else 0
    assert org_id is not None  # create_request refused an unknown campaign
    return _Accepted(
        request_id=created, org_id=org_id, campaign_id=batch.campaign_id, message_count=count
    )


@task(name="schedule-delivery", persist_result=False)
def schedule_delivery() -> None:
    """Create the deliver-request run now (the reconcilers would do it within seconds)."""
    try:
        run_coro_as_sync(scheduling.drain_outbox())
    except Exception as exc:  # Prefect busy: the request stays in the outbox, not lost
        get_run_logger().warning("delivery run left to the reconciler: %r", exc)


async def _final_state(request_id: str) -> StateType | None:
    """The delivery run's final state type, or None while it has not ended."""
    with session_scope() as session:
        request = session.get(Request, request_id)
        flow_run_id = request.flow_run_id if request is not None else None
    if flow_run_id is None:
        return None
    async with get_client() as client:
        run = await prefect_runs.read_run(client, flow_run_id)
    state = run.state
    return state.type if state is not None and state.is_final() else None


async def _report_when_done(accepted: _Accepted) -> list[str]:
    while True:
        final = await _final_state(accepted.request_id)
        if final is not None:
            break
        await asyncio.sleep(WAIT_POLL_SECONDS)
    if final != StateType.COMPLETED:
        raise RequestStateError(f"The request {accepted.request_id} ended {final.value.lower()}")
    return await lifecycle.report_links(org_id=accepted.org_id, request_id=accepted.request_id)


@task(name="wait-for-report", persist_result=False)
def wait_for_report(accepted: _Accepted) -> list[str]:
    """Block until the delivery run ends; the report links (or why there are none)."""
    links: list[str] = run_coro_as_sync(_report_when_done(accepted))
    return links


def _refusal_markdown(batch: SendBatchInput, problems: list[str]) -> str:
    source = f"{len(batch.messages)} JSON messages" if batch.messages is not None else "none"
    lines = [
        "# Batch refused",
        "",
        "Nothing was scheduled. Fix the input and run the deployment again.",
        "",
        "## Validation problems",
        "",
        *[f"- {problem}" for problem in problems],
        "",
        "## Input",
        "",
        "| field | value |",
        "|---|---|",
        f"| campaign_id | `{batch.campaign_id}` |",
        f"| send_at | {batch.send_at.isoformat() if batch.send_at else 'now'} |",
        f"| messages | {source} |",
        f"| csv_path | {f'`{batch.csv_path}`' if batch.csv_path else 'none'} |",
    ]
    return "\n".join(lines)


def _problems(batch: SendBatchInput, error: CampaignTriggerError) -> list[str]:
    """The refusal, plus the structural problems the service would only report one by one."""
    problems = [error.message]
    if batch.messages is not None and batch.csv_path is not None:
        problems.append("Give either messages or csv_path, not both.")
    if batch.messages is None and batch.csv_path is None:
        problems.append("Give messages or csv_path.")
    return list(dict.fromkeys(problems))


def _name_and_tag_run(accepted: _Accepted) -> None:
    """Show the request id and the campaign on this run, as on its delivery run."""
    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    flow_run = context.flow_run
    tags = sorted(
        {
            *flow_run.tags,
            *prefect_runs.run_tags(campaign_id=accepted.campaign_id, org_id=accepted.org_id),
        }
    )

    async def rename() -> None:
        async with get_client() as client:
            await client.update_flow_run(flow_run.id, name=f"send {accepted.request_id}", tags=tags)

    try:
        run_coro_as_sync(rename())
    except Exception as exc:  # cosmetic: never fail a sent batch for it
        logger.warning("could not rename the send-batch run: %r", exc)


@flow(
    name="send-batch",
    flow_run_name="send-batch {batch.campaign_id}",
    description="Send a batch of messages through an API-trigger campaign: JSON messages or "
    "a CSV file in storage, now or at send_at. Same checks, request and report as the API.",
    persist_result=False,
    validate_parameters=True,
)
def send_batch(batch: SendBatchInput, wait: bool = False) -> SendBatchResult:
    """Create a request from ``batch``; with ``wait``, block until delivered and return
    the report links."""
    run_logger = get_run_logger()
    try:
        accepted = create_batch_request(batch)
    except CampaignTriggerError as exc:
        create_markdown_artifact(
            key=REFUSED_ARTIFACT_KEY,
            markdown=_refusal_markdown(batch, _problems(batch, exc)),
            description=f"Batch refused: {exc.message}",
        )
        run_logger.error("batch refused: %s", exc.message)
        raise
    run_logger.info(
        "request %s accepted for campaign %s: %d messages, send at %s",
        accepted.request_id,
        accepted.campaign_id,
        accepted.message_count,
        batch.send_at.astimezone(UTC).isoformat() if batch.send_at else "now",
    )
    _name_and_tag_run(accepted)
    schedule_delivery()
    result = SendBatchResult(request_id=accepted.request_id)
    if wait:
        result.reports = wait_for_report(accepted)
        run_logger.info(
            "request %s delivered: %d report files", accepted.request_id, len(result.reports)
        )
    return result


__all__ = ["Message", "SendBatchInput", "SendBatchResult", "send_batch"]
