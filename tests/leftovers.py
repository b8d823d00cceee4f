"""What a test leaves to be sent, and its cancelling (the suite-wide fixture
``nothing_left_to_send`` of ``conftest.py``; tested in ``e2e/test_leftover_runs.py``).

A test that leaves a request in the session database's outbox, or a delivery run open on
the session's Prefect server, hands it to the next test's worker in the same process:
drained, claimed and delivered there, another test's request takes slots that test counts
on, or fails on a file the first test never wrote (the CI run of 1 Dec).
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime

import httpx
from sqlmodel import Session, col, select, update

from campaign_trigger.deployments.catalog import DELIVERY_POOL
from campaign_trigger.services.scheduling import in_outbox
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.models import Request, RequestState

PAGE = 200  # the Prefect server's largest page
OPEN_STATES = ["SCHEDULED", "PENDING", "RUNNING", "PAUSED", "CANCELLING", "CRASHED"]
CANCEL = {"state": {"type": "CANCELLED", "message": "left open"}, "force": True}


def outbox(database_url: str) -> set[str]:
    """The ids of the requests waiting in the database's outbox for a flow run."""
    with Session(engine_for(database_url)) as session:
        return set(session.exec(select(Request.id).where(*in_outbox())))


@dataclass
class Leftovers:
    """What was there before a test (:meth:`before`), so that :meth:`cancel` after it
    cancels only what came during it: what module fixtures made is kept."""

    database_url: str
    waiting: set[str]
    started: datetime = field(default_factory=lambda: datetime.now(UTC))

    @classmethod
    def before(cls, database_url: str) -> Leftovers:
        return cls(database_url, outbox(database_url))

    def cancel(self, *, prefect: bool) -> None:
        """Cancel the requests added to the outbox since :meth:`before` and, with
        ``prefect`` (the session's server is up), the delivery runs created since then and
        not ended (a run marked dead included: a worker would take it over)."""
        if left := outbox(self.database_url) - self.waiting:
            with Session(engine_for(self.database_url)) as session:
                session.execute(
                    update(Request)
                    .where(col(Request.id).in_(left), *in_outbox())
                    .values(state=RequestState.canceled)
                )
                session.commit()
        if prefect:
            with httpx.Client(base_url=os.environ["PREFECT_API_URL"], timeout=30) as http:
                for run_id in self._open_runs(http):
                    http.post(f"/flow_runs/{run_id}/set_state", json=CANCEL).raise_for_status()

    def _open_runs(self, http: httpx.Client) -> list[str]:
        left: list[str] = []
        for offset in itertools.count(0, PAGE):
            answer = http.post(
                "/flow_runs/filter",
                json={
                    "flow_runs": {"state": {"type": {"any_": OPEN_STATES}}},
                    "work_pools": {"name": {"any_": [DELIVERY_POOL]}},
                    "sort": "ID_DESC",
                    "offset": offset,
                    "limit": PAGE,
                },
            )
            answer.raise_for_status()
            page = answer.json()
            left += [r["id"] for r in page if datetime.fromisoformat(r["created"]) >= self.started]
            if len(page) < PAGE:
                break
        return left
