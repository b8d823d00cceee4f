"""Provider authentication: Google OAuth2 access tokens (FCM) and APNs provider JWTs.

Both are cached: an access token until shortly before it expires, an APNs JWT for
``reuse_seconds`` (Apple wants one refreshed every 20-60 minutes, no more often).
The clock is injectable so tests can move time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Final

import httpx
import jwt

from campaign_trigger.delivery.credentials import ApnsCredentials, FcmCredentials

FCM_SCOPE: Final = "https://www.googleapis.com/auth/firebase.messaging"
JWT_BEARER: Final = "urn:ietf:params:oauth:grant-type:jwt-bearer"


class AuthRefused(Exception):
    """The provider refused our credentials (bad key, revoked account...)."""


class AuthUnavailable(Exception):
    """The token endpoint could not be reached or failed; retry later."""


class GoogleAccessTokens:
    """OAuth2 access tokens by the JWT-bearer grant (RS256), cached until near expiry."""

    def __init__(
        self,
        credentials: FcmCredentials,
        *,
        client: httpx.AsyncClient,
        refresh_margin_seconds: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._credentials = credentials
        self._client = client
        self._margin = refresh_margin_seconds
        self._clock = clock
        self._token: str | None = None
        self._expires_at = 0.0
        self._lock = asyncio.Lock()
        self.fetches = 0

    def _assertion(self, now: int) -> str:
        claims = {
            "iss": self._credentials.client_email,
            "scope": FCM_SCOPE,
            "aud": self._credentials.token_uri,
            "iat": now,
            "exp": now + 3600,
        }
        headers = (
            {"kid": self._credentials.private_key_id} if self._credentials.private_key_id else None
        )
        return jwt.encode(claims, self._credentials.private_key, algorithm="RS256", headers=headers)

    def cached(self) -> str | None:
        """The cached token if it is still fresh enough to use."""
        if self._token is not None and self._clock() < self._expires_at - self._margin:
            return self._token
        return None

    async def get(self) -> str:
        """A valid access token, fetched only when the cached one is near expiry."""
        token = self.cached()
        if token is not None:
            return token
        async with self._lock:
            token = self.cached()
            if token is None:
                token = await self._fetch()
            return token

    def invalidate(self, token: str) -> None:
        """Forget ``token`` (the provider said it is no longer valid)."""
        if self._token == token:
            self._token = None

    async def _fetch(self) -> str:
        now = self._clock()
        form = {"grant_type": JWT_BEARER, "assertion": self._assertion(int(now))}
        try:
            response = await self._client.post(self._credentials.token_uri, data=form)
        except httpx.HTTPError as exc:
            raise AuthUnavailable(
                f"token endpoint {self._credentials.token_uri} unreachable: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        self.fetches += 1
        if response.status_code in (400, 401, 403):
            raise AuthRefused(
                f"token endpoint refused the service account ({response.status_code})"
            )
        if response.status_code != 200:
            raise AuthUnavailable(
                f"token endpoint {self._credentials.token_uri} answered {response.status_code}"
            )
        try:
            document = response.json()
            token = str(document["access_token"])
            expires_in = float(document.get("expires_in", 3600))
        except (ValueError, KeyError, TypeError):
            raise AuthUnavailable("token endpoint answered an unreadable body") from None
        self._token, self._expires_at = token, now + expires_in
        return token


class ApnsProviderTokens:
    """ES256 provider JWTs (``kid`` = key id, ``iss`` = team id), reused for a while."""

    def __init__(
        self,
        credentials: ApnsCredentials,
        *,
        reuse_seconds: float = 40 * 60,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 20 * 60 <= reuse_seconds <= 60 * 60:
            raise ValueError("APNs provider tokens must be reused for 20 to 60 minutes")
        self._credentials = credentials
        self._reuse = reuse_seconds
        self._clock = clock
        self._token: str | None = None
        self._issued_at = 0
        self.minted = 0

    def get(self) -> str:
        """The current JWT; a new one once it is ``reuse_seconds`` old."""
        if self._token is None or self._clock() - self._issued_at >= self._reuse:
            self._mint()
        assert self._token is not None
        return self._token

    def renew(self, stale: str) -> str:
        """A new JWT if ``stale`` is still the current one (APNs said it expired)."""
        if self._token == stale:
            self._mint()
        return self.get()

    def _mint(self) -> None:
        # iat is now, rounded down: never in the future, which APNs refuses (403
        # InvalidProviderToken). A token renewed within the same second still differs
        # from the stale one: every ES256 signature has a fresh random nonce.
        issued_at = int(self._clock())
        self._token = jwt.encode(
            {"iss": self._credentials.team_id, "iat": issued_at},
            self._credentials.private_key,
            algorithm="ES256",
            headers={"kid": self._credentials.key_id},
        )
        self._issued_at = issued_at
        self.minted += 1
