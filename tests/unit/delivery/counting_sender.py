"""A provider for the send loop's tests: answers every message after a few loop turns,
counting its sends and the most in flight at once."""

from __future__ import annotations

import asyncio

from campaign_trigger.delivery.base import PushMessage
from campaign_trigger.delivery.mapping import OK, Verdict
from campaign_trigger.delivery.sending import Answer, RetryingSender
from campaign_trigger.store.models import Platform


class CountingSender(RetryingSender):
    platform = Platform.android

    def __init__(self, concurrency: int) -> None:
        super().__init__(concurrency=concurrency, max_attempts=1)
        self.posts = 0
        self.in_flight = 0
        self.most_in_flight = 0

    def _build(self, message: PushMessage) -> bytes:
        return b"{}"

    async def _post(self, message: PushMessage, body: bytes) -> Answer:
        self.posts += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        for _ in range(3):
            await asyncio.sleep(0)
        self.in_flight -= 1
        return Answer(200, b"{}", None, "credential")

    def _map(self, answer: Answer) -> Verdict:
        return OK

    def _refresh(self, credential: str) -> None:
        pass

    async def aclose(self) -> None:
        pass
