"""Creating delivery runs on a busy SQLite-backed Prefect server: runs refused with
"database is locked" are posted again and created, nothing is lost, and no log line
dumps the server's SQL."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from campaign_trigger.services import prefect_runs
from campaign_trigger.services.prefect_runs import RunToCreate

LOCKED = (
    "(sqlite3.OperationalError) database is locked\n"
    "[SQL: INSERT INTO flow_run (id, name) VALUES (?, ?)]\n[parameters: ('x', 'y')]"
)


class BusyServer:
    """A fake Prefect client whose bulk route refuses the first ``busy`` tries of each run
    as a locked SQLite database does; records what it was sent."""

    def __init__(self, *, busy: int, refuse: str | None = None) -> None:
        self.busy = busy
        self.refuse = refuse
        self.posts: list[list[str]] = []
        self.tries: dict[str, int] = {}

    async def read_deployment_by_name(self, name: str) -> Any:
        return type("Deployment", (), {"id": uuid4()})()

    async def request(self, method: str, path: str, **kwargs: Any) -> Any:
        names = [run["name"] for run in kwargs["json"]]
        self.posts.append(names)
        results = []
        for name in names:
            self.tries[name] = self.tries.get(name, 0) + 1
            if name == self.refuse:
                results.append({"status": "FAILED", "error": "Parameter validation failed: x"})
            elif self.tries[name] <= self.busy:
                results.append({"status": "FAILED", "error": LOCKED})
            else:
                results.append({"status": "CREATED", "flow_run_id": f"run-{name}"})
        return type("Response", (), {"json": lambda _self: {"results": results}})()


def _runs(n: int) -> list[RunToCreate]:
    now = datetime.now(UTC)
    return [
        RunToCreate(request_id=f"r{i}", campaign_id="c", org_id=1, send_at=now) for i in range(n)
    ]


@pytest.fixture(autouse=True)
def _fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prefect_runs, "BUSY_RETRY_DELAYS", (0.0, 0.0, 0.0))


async def test_runs_refused_by_a_locked_database_are_posted_again_and_created(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = BusyServer(busy=2)
    with caplog.at_level(logging.DEBUG, logger="campaign_trigger.services.prefect_runs"):
        created = await prefect_runs.create_runs(server, _runs(3))  # type: ignore[arg-type]
    assert created == {f"r{i}": f"run-r{i}" for i in range(3)}
    assert server.posts == [["r0", "r1", "r2"]] * 3
    assert "database is locked" not in caplog.text
    assert "SQL" not in caplog.text


async def test_runs_still_refused_stay_in_the_outbox_with_one_short_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = BusyServer(busy=99, refuse="r1")
    with caplog.at_level(logging.DEBUG, logger="campaign_trigger.services.prefect_runs"):
        created = await prefect_runs.create_runs(server, _runs(3))  # type: ignore[arg-type]
    assert created == {}
    assert len(server.posts) == 4  # the first post and three retries of the busy ones
    assert server.posts[1:] == [["r0", "r2"]] * 3
    lines = [record.getMessage() for record in caplog.records]
    assert lines == [
        "flow run not created for a request: Parameter validation failed: x",
        "2 flow runs not created yet (the Prefect server was busy): they stay in the outbox "
        "for the next pass",
    ]
