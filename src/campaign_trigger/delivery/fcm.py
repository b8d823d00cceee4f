"""FCM HTTP v1 client: ``POST {base}/v1/projects/{project}/messages:send``.

Sends over HTTP/1.1 keep-alive connections (one per concurrent send, up to
``concurrency``) with the lean client of ``delivery/http1.py``: for many small requests
it needs far less CPU than aiohttp, itself 4-9x faster than httpx here
(docs/benchmarks.md). The OAuth2 access token comes from
:class:`~campaign_trigger.delivery.auth.GoogleAccessTokens` through httpx.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx

from campaign_trigger.delivery.auth import GoogleAccessTokens
from campaign_trigger.delivery.base import PushMessage
from campaign_trigger.delivery.credentials import FcmCredentials
from campaign_trigger.delivery.http1 import Http1Pool, finish_request, request_head
from campaign_trigger.delivery.mapping import Verdict, map_fcm
from campaign_trigger.delivery.payload import fcm_body
from campaign_trigger.delivery.sandbox_tls import client_context
from campaign_trigger.delivery.sending import Answer, RetryingSender
from campaign_trigger.store.models import Platform


class FcmProvider(RetryingSender):
    """Push to Android devices through FCM HTTP v1."""

    platform = Platform.android

    def __init__(
        self,
        credentials: FcmCredentials,
        *,
        concurrency: int = 256,
        max_attempts: int = 4,
        timeout_seconds: float = 10.0,
        clock: Callable[[], float] = time.time,
        backoff_base: float = 0.25,
    ) -> None:
        super().__init__(
            concurrency=concurrency,
            max_attempts=max_attempts,
            backoff_base=backoff_base,
        )
        self.endpoint = credentials.base_url
        self.pool = Http1Pool(
            credentials.base_url, timeout_seconds=timeout_seconds, ca_file=credentials.ca_file
        )
        self._path = f"{self.pool.base_path}/v1/projects/{credentials.project_id}/messages:send"
        self._token_client = httpx.AsyncClient(
            timeout=timeout_seconds, verify=client_context(credentials.ca_file)
        )
        self.tokens = GoogleAccessTokens(credentials, client=self._token_client, clock=clock)
        self._head = b""
        self._head_token = ""

    async def _ready(self) -> None:
        """The access token (an assertion signed here and a round trip to the token
        endpoint, unless a fresh one is cached) and a connection to FCM: what a first send
        would wait for after the send time."""
        await self.tokens.get()
        await self.pool.warm()

    def _build(self, message: PushMessage) -> bytes:
        return fcm_body(message)

    async def _post(self, message: PushMessage, body: bytes) -> Answer:
        token = self.tokens.cached() or await self.tokens.get()
        if token != self._head_token:
            headers = (
                f"Authorization: Bearer {token}\r\n"
                "Content-Type: application/json; charset=UTF-8\r\n"
            )
            self._head = request_head(
                path=self._path, authority=self.pool.authority, headers=headers
            )
            self._head_token = token
        response = await self.pool.request(finish_request(self._head, body))
        status = response.status
        retry_after = None if status == 200 else response.headers.get(b"retry-after")
        return Answer(
            status, response.body, retry_after.decode("latin-1") if retry_after else None, token
        )

    def _map(self, answer: Answer) -> Verdict:
        return map_fcm(answer.status, answer.body)

    def _refresh(self, credential: str) -> None:
        self.tokens.invalidate(credential)

    async def aclose(self) -> None:
        """Close the send connections and the token client."""
        await self.pool.aclose()
        await self._token_client.aclose()
