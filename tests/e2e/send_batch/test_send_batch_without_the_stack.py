"""The first ``send_batch`` snippet of docs/python.md run where the stack's Prefect server
is not named (no ``PREFECT_API_URL``): Prefect starts a temporary server of its own, which
has no ``deliver-request`` deployment. The call must fail before it stores anything, with
a message that says what to do, so that a retry cannot send twice."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from sqlmodel import Session, func, select

from campaign_trigger.services import demo
from campaign_trigger.store.db import engine_for
from campaign_trigger.store.migrate import upgrade
from campaign_trigger.store.models import Request, RequestMessage
from support import REPO

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def first_send_batch_snippet() -> str:
    page = (REPO / "docs" / "python.md").read_text()
    section = page.split("## The flow: `send_batch`", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert match is not None
    return match.group(1)


def _counts(url: str) -> tuple[int, int]:
    with Session(engine_for(url)) as session:
        requests = session.exec(select(func.count()).select_from(Request)).one()
        messages = session.exec(select(func.count()).select_from(RequestMessage)).one()
    return requests, messages


def test_the_snippet_without_the_stacks_prefect_server_fails_before_storing(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    url = f"sqlite:///{tmp_path / 'ct.sqlite'}"
    upgrade(url)
    with Session(engine_for(url)) as session:
        demo.seed(session=session, home=home)
        session.commit()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "CT_"))}
    env.update(
        CT_HOME=str(home),
        CT_DATABASE_URL=url,
        CT_SECRET_KEY=os.environ["CT_SECRET_KEY"],
        PREFECT_HOME=str(tmp_path / "prefect"),  # the temporary server's own database
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        # on a busy 2-core machine the temporary server needs more than Prefect's 20 s
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="150",
    )
    done = subprocess.run(
        [sys.executable, "-c", first_send_batch_snippet()],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode != 0, done.stdout
    assert "has no deliver-request deployment" in done.stderr, done.stderr[-3000:]
    assert "nothing was stored" in done.stderr
    assert "PREFECT_API_URL=http://127.0.0.1:4200/api" in done.stderr
    assert _counts(url) == (0, 0)
