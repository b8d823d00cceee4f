"""One SSL context per arguments for the Prefect clients of a worker process.

Every ``PrefectClient`` builds a fresh ``ssl.create_default_context(cafile=...)``,
loading the CA bundle (~50 ms of CPU), even for a plain-HTTP API; the flow engine
makes several clients per run, which profiling showed to be the worker's largest cost
(a quarter of a core at 3 runs/s). Contexts are safe to share.
"""

from __future__ import annotations

import ssl
from typing import Any


def share_prefect_ssl_contexts() -> None:
    """Make Prefect clients of this process share their SSL context (cached per
    arguments, for the Prefect client module only)."""
    import prefect.client.orchestration as orchestration

    namespace = vars(orchestration)
    if not isinstance(namespace.get("ssl"), _SharedSSL):
        namespace["ssl"] = _SharedSSL()


class _SharedSSL:
    """The ``ssl`` module, with ``create_default_context`` cached per arguments."""

    def __init__(self) -> None:
        self._contexts: dict[tuple[Any, ...], ssl.SSLContext] = {}

    def create_default_context(self, *args: Any, **kwargs: Any) -> ssl.SSLContext:
        key = (args, tuple(sorted(kwargs.items())))
        context = self._contexts.get(key)
        if context is None:
            context = self._contexts[key] = ssl.create_default_context(*args, **kwargs)
        return context

    def __getattr__(self, name: str) -> Any:
        return getattr(ssl, name)
