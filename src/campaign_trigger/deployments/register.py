"""The deployments this package registers on the Prefect server.

``deliver-request/default`` has no work pool and no schedule: its runs are created
one per request by ``services.scheduling`` and executed in-process by
``campaign-trigger worker`` (``deployments.worker``).
"""

from __future__ import annotations

import logging

from prefect.deployments.runner import RunnerDeployment

from campaign_trigger.flows.deliver import deliver_request
from campaign_trigger.services import prefect_runs

logger = logging.getLogger(__name__)


async def deliver_request_deployment() -> RunnerDeployment:
    return await deliver_request.ato_deployment(
        name=prefect_runs.DEPLOYMENT_NAME,
        description="Delivers one trigger request (one run per request, created by the API).",
        tags=["campaign-trigger"],
    )


async def ensure_deployments() -> None:
    """Create or update our deployments (idempotent; safe from several processes)."""
    deployment_id = await (await deliver_request_deployment()).aapply()
    prefect_runs.forget_deployment_id()
    logger.info("deployment %s is %s", prefect_runs.DEPLOYMENT_FULL_NAME, deployment_id)
