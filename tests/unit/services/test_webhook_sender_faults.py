"""The completion webhooks' sender against a real receiver over HTTP and a shared SQLite
file: two senders draining one outbox POST each event once, and a sender process
SIGKILLed mid-POST leaves its event to be sent again, with the same id, once its lease
ends (counted at the receiver)."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import SecretStr
from sqlmodel import Session, col, select

from campaign_trigger.config import Settings
from campaign_trigger.services import webhooks
from campaign_trigger.services.request_states import set_state
from campaign_trigger.services.webhook_sender import run_sender
from campaign_trigger.store.db import Sessions, engine_for
from campaign_trigger.store.models import (
    RequestState,
    WebhookAttempt,
    WebhookDelivery,
)
from service_support import Org, add_json_request
from support import ManagedProcess, until

pytestmark = [pytest.mark.slow]

SECRET_KEY = "webhook-sender-faults-" + "k" * 32


class Receiver:
    """An HTTP receiver of events on a free port: the event ids it was POSTed, in order.
    While ``hold`` is clear it holds every POST without an answer; each answer comes
    ``delay`` seconds after its POST."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.hold = threading.Event()
        self.hold.set()
        self.delay = 0.0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.ids.append(json.loads(body)["id"])
                receiver.hold.wait(60)
                time.sleep(receiver.delay)
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        class Server(ThreadingHTTPServer):
            request_queue_size = 128  # two senders' POSTs at once (the default 5 refused some)

        self.server = Server(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.handle_error = lambda *args: None  # type: ignore[method-assign]  # a killed sender's POST
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.hold.set()
        self.server.shutdown()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    receiver = Receiver()
    yield receiver
    receiver.close()


@pytest.fixture
def sender_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "secret_key": SecretStr(SECRET_KEY),
            "send_to_sandbox": True,  # a receiver on 127.0.0.1
            "webhook_timeout_seconds": 10.0,  # a receiver in this process, on a busy machine
            "webhook_poll_seconds": 0.05,
        }
    )


def _events(session: Session, settings: Settings, org: Org, url: str, count: int) -> None:
    """``count`` requests of ``org`` failed: one event each for the endpoint at ``url``."""
    webhooks.register(session=session, settings=settings, org_id=org.org_id, url=url)
    for _ in range(count):
        request_id = add_json_request(session, org, message_count=1)
        set_state(session=session, request_id=request_id, state=RequestState.failed)
    session.commit()


def _sessions(database: str) -> Sessions:
    @contextmanager
    def sessions() -> Iterator[Session]:
        with Session(engine_for(database), expire_on_commit=False) as own:
            yield own
            own.commit()

    return sessions


async def _drain(
    settings: Settings, database: str, *, senders: int, until: Callable[[], bool]
) -> None:
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(run_sender(sessions=_sessions(database), settings=settings, stop=stop))
        for _ in range(senders)
    ]
    deadline = time.monotonic() + 60
    while not until():
        assert time.monotonic() < deadline, "the events were not all delivered"
        await asyncio.sleep(0.05)
    stop.set()
    await asyncio.gather(*tasks)


def _delivered(session: Session) -> int:
    session.expire_all()
    return len(
        session.exec(
            select(WebhookDelivery).where(col(WebhookDelivery.delivered_at).is_not(None))
        ).all()
    )


def test_two_senders_on_one_outbox_post_each_event_once(
    session: Session, sender_settings: Settings, org: Org, database: str, receiver: Receiver
) -> None:
    events = 60
    _events(session, sender_settings, org, receiver.url, events)
    asyncio.run(
        _drain(sender_settings, database, senders=2, until=lambda: _delivered(session) == events)
    )
    assert len(receiver.ids) == events
    assert set(Counter(receiver.ids).values()) == {1}  # none twice
    attempts = session.exec(select(WebhookAttempt)).all()
    # one answered attempt an event (one that failed before reaching the receiver, were
    # the machine too busy, is retried: it was not received, so it is not a second copy)
    assert len([a for a in attempts if a.status_code == 204]) == events


def test_a_receiver_answering_within_the_webhook_timeout_gets_the_event_once(
    session: Session, sender_settings: Settings, org: Org, database: str, receiver: Receiver
) -> None:
    """The POST may take ``webhook_timeout_seconds``, not httpx's default 5 s: an answer
    after 5.5 s delivers the event (it was a ReadTimeout, the event POSTed again later)."""
    settings = sender_settings.model_copy(update={"webhook_timeout_seconds": 8.0})
    _events(session, settings, org, receiver.url, 1)
    [delivery] = session.exec(select(WebhookDelivery)).all()
    receiver.delay = 5.5

    def attempted() -> bool:
        session.expire_all()
        return session.exec(select(WebhookAttempt)).first() is not None

    asyncio.run(_drain(settings, database, senders=1, until=attempted))
    attempts = session.exec(select(WebhookAttempt)).all()
    assert [(a.status_code, a.error) for a in attempts] == [(204, None)]
    assert attempts[0].duration_ms >= 5500
    assert _delivered(session) == 1
    assert receiver.ids == [delivery.event_id]


# The sender of a worker process, alone in a process of its own; the lease it takes is the
# POST's timeout and one second, not thirty, so that the test waits seconds for its end.
SENDER = """
import asyncio, sys
from campaign_trigger.config import get_settings
from campaign_trigger.services import webhook_sender
from campaign_trigger.store.db import session_scope
webhook_sender.LEASE_MARGIN_SECONDS = 1.0
asyncio.run(webhook_sender.run_sender(
    sessions=session_scope, settings=get_settings(), stop=asyncio.Event()))
"""


def test_a_sender_killed_mid_post_leaves_the_event_to_be_sent_again_with_its_id(
    session: Session,
    sender_settings: Settings,
    org: Org,
    database: str,
    receiver: Receiver,
    tmp_path: Path,
) -> None:
    _events(session, sender_settings, org, receiver.url, 1)
    [delivery] = session.exec(select(WebhookDelivery)).all()
    receiver.hold.clear()  # the POST reaches the receiver and waits there
    env = {
        "CT_HOME": str(tmp_path),
        "CT_DATABASE_URL": database,
        "CT_SECRET_KEY": SECRET_KEY,
        "CT_SEND_TO_SANDBOX": "true",
        "CT_WEBHOOK_TIMEOUT_SECONDS": "2",
        "CT_WEBHOOK_POLL_SECONDS": "0.05",
    }
    sender = ManagedProcess(
        "webhook-sender", [sys.executable, "-c", SENDER], log_dir=tmp_path, env=env
    )
    try:
        until(lambda: len(receiver.ids) == 1, seconds=60, what="the sender never POSTed")
        sender.kill()  # SIGKILL mid-POST: no answer read, no attempt recorded
    finally:
        sender.stop()
    session.expire_all()
    killed = session.get(WebhookDelivery, delivery.id)
    assert killed is not None
    assert (killed.attempt_count, killed.delivered_at) == (0, None)
    assert killed.next_attempt_at is not None  # its lease: not due before it ends
    lease_end = killed.next_attempt_at.replace(tzinfo=UTC)
    assert lease_end > datetime.now(UTC)

    receiver.hold.set()
    asyncio.run(
        _drain(sender_settings, database, senders=1, until=lambda: _delivered(session) == 1)
    )
    assert receiver.ids == [delivery.event_id, delivery.event_id]  # again, the same id
    attempts = session.exec(select(WebhookAttempt)).all()
    assert [(a.status_code, a.error) for a in attempts] == [(204, None)]
    assert attempts[0].attempted_at.replace(tzinfo=UTC) >= lease_end  # not before the lease ended
