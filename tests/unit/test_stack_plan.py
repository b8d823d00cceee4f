"""What ``up`` starts: how many API processes it picks."""

from __future__ import annotations

import pytest

from campaign_trigger.config import Settings
from campaign_trigger.stack import api_processes


@pytest.mark.parametrize(("cpus", "expected"), [(None, 1), (1, 1), (2, 1), (7, 1), (8, 2), (16, 4)])
def test_up_runs_one_api_process_per_four_cores(
    monkeypatch: pytest.MonkeyPatch, cpus: int | None, expected: int
) -> None:
    monkeypatch.delenv("CT_API_WORKERS", raising=False)
    assert api_processes(Settings(), cpus) == expected


def test_ct_api_workers_wins_over_the_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CT_API_WORKERS", "1")
    assert api_processes(Settings(), 16) == 1
    monkeypatch.setenv("CT_API_WORKERS", "3")
    assert api_processes(Settings(), 2) == 3
