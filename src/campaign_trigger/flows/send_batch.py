"""The ``send-batch`` flow: send a batch by hand (Prefect UI form), on a schedule, or from Python.

Orchestration only: its steps are the tasks of ``tasks/send_batch.py``, which go
through the same create use case as ``POST /api/campaigns/trigger`` (the same checks
in the same order, the same error texts, the same stored request, the same
``deliver-request`` run, the same report). It acts on behalf of the campaign's
organisation and takes one unit of its request quota, like an API call. A refused
batch fails the run, with the spec's error text in the run's state and in a markdown
artifact (``send-batch-refused``); a batch that cannot be delivered (no
``deliver-request`` deployment on the Prefect server) stores nothing. With
``dry_run`` it runs the same checks, stores, schedules and sends nothing, and shows
what would be sent in a markdown artifact (``send-batch-preview``).

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

import logging
from datetime import UTC, datetime
from typing import Annotated

from prefect import flow, get_client, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.context import FlowRunContext
from prefect.utilities.asyncutils import run_coro_as_sync
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, JsonValue

from campaign_trigger.errors import CampaignTriggerError, ReportWaitFailed
from campaign_trigger.schemas.api import Message
from campaign_trigger.schemas.preview import TriggerPreview
from campaign_trigger.services import prefect_runs
from campaign_trigger.tasks import send_batch as steps
from campaign_trigger.tasks.artifacts import preview_markdown

logger = logging.getLogger(__name__)

REFUSED_ARTIFACT_KEY = "send-batch-refused"
PREVIEW_ARTIFACT_KEY = "send-batch-preview"

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

    request_id: str | None = Field(
        description="The request, as the HTTP API knows it (none for a dry run)."
    )
    reports: list[str] = Field(
        default_factory=list,
        description="Signed links to the report files (filled when run with wait=True).",
    )
    preview: TriggerPreview | None = Field(
        default=None, description="With dry_run: what would be sent (nothing was)."
    )


def csv_path_for_run(csv_path: str) -> str:
    """``{date}`` in ``csv_path`` becomes the run's scheduled day (UTC, ``YYYY-MM-DD``), so
    a daily schedule reads that day's file and never sends yesterday's again."""
    if "{date}" not in csv_path:
        return csv_path
    context = FlowRunContext.get()
    expected = context.flow_run.expected_start_time if context and context.flow_run else None
    day = (expected or datetime.now(UTC)).astimezone(UTC).date().isoformat()
    return csv_path.replace("{date}", day)


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


def _name_and_tag_run(accepted: steps.Accepted) -> None:
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
def send_batch(
    batch: SendBatchInput,
    wait: bool = False,
    # The bound in the annotation: Prefect's schema and validation take a Field() default's
    # default and description only (0 and negatives were accepted).
    wait_timeout_seconds: Annotated[float, Field(gt=0)] = Field(
        default=3600, description="With wait: give up waiting for the report after this."
    ),
    dry_run: bool = Field(
        default=False,
        description="Preview only: run every check of a send and show what would be sent "
        "(counts, devices per app, the first messages rendered, payloads over 4 KB) as a "
        "markdown artifact; nothing is stored, scheduled or sent.",
    ),
) -> SendBatchResult:
    """Create a request from ``batch``; with ``wait``, block until delivered (at most
    ``wait_timeout_seconds``) and return the report links. With ``dry_run``, only
    preview it (artifact ``send-batch-preview``, and the result's ``preview``)."""
    run_logger = get_run_logger()
    csv_key = csv_path_for_run(batch.csv_path) if batch.csv_path is not None else None
    try:
        if dry_run:
            preview = steps.preview_request(
                campaign_id=batch.campaign_id,
                send_at=batch.send_at,
                messages=batch.messages,
                csv_key=csv_key,
            )
        else:
            accepted = steps.create_request(
                campaign_id=batch.campaign_id,
                send_at=batch.send_at,
                messages=batch.messages,
                csv_key=csv_key,
                fingerprint=batch.model_dump(mode="json"),
            )
    except CampaignTriggerError as exc:
        create_markdown_artifact(
            key=REFUSED_ARTIFACT_KEY,
            markdown=_refusal_markdown(batch, _problems(batch, exc)),
            description=f"Batch refused: {exc.message}",
        )
        run_logger.error("batch refused: %s", exc.message)
        raise
    if dry_run:
        create_markdown_artifact(
            key=PREVIEW_ARTIFACT_KEY,
            markdown=preview_markdown(preview),
            description=f"Dry run: {preview.message_count} messages, nothing sent",
        )
        run_logger.info("dry run: %d messages previewed, nothing sent", preview.message_count)
        return SendBatchResult(request_id=None, preview=preview)
    run_logger.info(
        "request %s accepted for campaign %s: %d messages, send at %s",
        accepted.request_id,
        accepted.campaign_id,
        accepted.message_count,
        batch.send_at.astimezone(UTC).isoformat() if batch.send_at else "now",
    )
    _name_and_tag_run(accepted)
    steps.schedule_delivery()
    result = SendBatchResult(request_id=accepted.request_id)
    if wait:
        try:
            result.reports = steps.wait_for_report(accepted, timeout_seconds=wait_timeout_seconds)
        except Exception as exc:
            # The batch is stored and will be delivered: an error now must say so, with
            # the request id, or a caller who retries would send it twice.
            if accepted.request_id in str(exc):
                raise
            raise ReportWaitFailed(
                f"The request {accepted.request_id} is stored and will be delivered, but "
                f"waiting for its report failed ({type(exc).__name__}: {exc}); do not send "
                f"it again: ask for its report later (GET /api/campaigns/report?request_id="
                f"{accepted.request_id})"
            ) from exc
        run_logger.info(
            "request %s delivered: %d report files", accepted.request_id, len(result.reports)
        )
    return result


__all__ = ["Message", "SendBatchInput", "SendBatchResult", "send_batch"]
