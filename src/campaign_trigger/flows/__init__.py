"""Prefect flows: orchestration only (the rules live in services/ and tasks/)."""

from campaign_trigger.flows.deliver import deliver_request

__all__ = ["deliver_request"]
from campaign_trigger.flows.send_batch import send_batch as send_batch
