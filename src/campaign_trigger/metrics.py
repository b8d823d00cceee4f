"""Prometheus metrics of the API and the delivery worker (``GET /metrics``).

One registry of our own (not Prefect's): the API serves it at ``/metrics``, a worker
on ``CT_WORKER_METRICS_PORT``. What each process counts is what happens in it: the
API counts creates accepted and refused, quota refusals; a worker counts messages by
provider and outcome, provider latency and retries, and the runs it executes. Both
show the outbox depth, read from the database at scrape time.

Delivery sends tens of thousands of messages a second from one event loop, so its
figures are not recorded per message through the locks of ``prometheus_client``:
a sender keeps a plain :class:`LatencyTally` (no lock: one event loop owns it) and
adds it to the shared histogram once per batch; messages are counted per batch and
outcome (:func:`count_messages`).
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections import Counter as Tally
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Final

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    start_http_server,
)
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from campaign_trigger.store.models import Platform

__all__ = ["CONTENT_TYPE_LATEST", "exposition"]

# no *_created series: they would double the page for no use here
disable_created_metrics()  # type: ignore[no-untyped-call]
REGISTRY: Final = CollectorRegistry()
ProcessCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)  # the collector's passes by generation (heap.py)

PROVIDERS: Final = {Platform.android: "fcm", Platform.ios: "apns"}
SENT: Final = "sent"
# Seconds: a local sandbox answers in well under a millisecond, Google and Apple in tens.
LATENCY_BUCKETS: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)

REQUESTS_ACCEPTED: Final = Counter(
    "campaign_trigger_requests_accepted",
    "Requests accepted by POST /api/campaigns/trigger.",
    registry=REGISTRY,
)
REQUESTS_REFUSED: Final = Counter(
    "campaign_trigger_requests_refused",
    "Requests refused by POST /api/campaigns/trigger, by reason (the error's kind).",
    ["reason"],
    registry=REGISTRY,
)
QUOTA_REFUSALS: Final = Counter(
    "campaign_trigger_quota_refusals",
    "Calls refused because the organisation's request quota is spent (429), any route.",
    registry=REGISTRY,
)
MESSAGES: Final = Counter(
    "campaign_trigger_messages",
    "Messages whose outcome was recorded, by provider (fcm, apns, inapp) and outcome "
    "(sent, or the report's error_message).",
    ["provider", "outcome"],
    registry=REGISTRY,
)
RETRIES: Final = Counter(
    "campaign_trigger_provider_retries",
    "Sends retried after a transient provider answer (429, 5xx, timeout, connection).",
    ["provider"],
    registry=REGISTRY,
)
RUNS_IN_FLIGHT: Final = Gauge(
    "campaign_trigger_runs_in_flight",
    "Delivery flow runs this worker is executing now.",
    registry=REGISTRY,
)
_RETRY_CHILDREN: Final = {name: RETRIES.labels(name) for name in PROVIDERS.values()}


def provider_of(platform: Platform) -> str:
    return PROVIDERS[platform]


def count_messages(provider: str, outcomes: Mapping[str, int]) -> None:
    """Add a batch's outcomes (``error_message`` -> count, ``""`` for sent)."""
    for outcome, count in outcomes.items():
        if count:
            MESSAGES.labels(provider, outcome or SENT).inc(count)


def count_retry(platform: Platform) -> None:
    _RETRY_CHILDREN[PROVIDERS[platform]].inc()


class LatencyTally:
    """A sender's provider latencies since its last flush: bucket counts and their sum,
    plain numbers owned by one event loop (no lock per observation)."""

    __slots__ = ("counts", "total")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self.total += seconds

    def flush(self, provider: str) -> None:
        """Add the tally to the process's histogram and start again from zero."""
        if any(self.counts):
            _LATENCY.add(provider, self.counts, self.total)
            self.counts = [0] * (len(LATENCY_BUCKETS) + 1)
            self.total = 0.0


class _LatencyHistogram(Collector):
    """``campaign_trigger_provider_latency_seconds``, fed by whole tallies."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._books: dict[str, tuple[list[int], list[float]]] = {}

    def add(self, provider: str, counts: list[int], total: float) -> None:
        with self._lock:
            book, sums = self._books.setdefault(provider, ([0] * len(counts), [0.0]))
            for index, count in enumerate(counts):
                book[index] += count
            sums[0] += total

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "campaign_trigger_provider_latency_seconds",
            "Time from sending a push to the provider's answer, by provider.",
            labels=["provider"],
        )
        with self._lock:
            books = {name: (list(book), sums[0]) for name, (book, sums) in self._books.items()}
        for provider, (book, total) in sorted(books.items()):
            cumulative, buckets = 0, []
            for bound, count in zip((*LATENCY_BUCKETS, float("inf")), book, strict=True):
                cumulative += count
                buckets.append((_bound(bound), float(cumulative)))
            family.add_metric([provider], buckets, total)
        yield family


def _bound(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(value)


_LATENCY: Final = _LatencyHistogram()
REGISTRY.register(_LATENCY)


class _ReadAtScrape(Collector):
    """A gauge read when scraped (from the database): absent when it cannot be read."""

    def __init__(self, name: str, documentation: str, read: Callable[[], int]) -> None:
        self._name, self._documentation, self._read = name, documentation, read

    def collect(self) -> Iterable[Metric]:
        try:
            value = self._read()
        except Exception:  # the database is down: /health says so; no made-up figure here
            return []
        return [GaugeMetricFamily(self._name, self._documentation, value=value)]


def _outbox_depth() -> int:
    from campaign_trigger.services.scheduling import outbox_depth
    from campaign_trigger.store.db import session_scope

    with session_scope() as session:
        return outbox_depth(session=session)


REGISTRY.register(
    _ReadAtScrape(
        "campaign_trigger_outbox_depth",
        "Accepted requests whose flow run is not created yet (the scheduling outbox).",
        _outbox_depth,
    )
)


def count_outcomes_by_provider(outcomes: Iterable[tuple[str, str]]) -> None:
    """Add ``(provider, error_message)`` pairs, one per message."""
    tally: Tally[tuple[str, str]] = Tally(outcomes)
    for (provider, outcome), count in tally.items():
        MESSAGES.labels(provider, outcome or SENT).inc(count)


def serve(*, port: int, host: str = "0.0.0.0") -> None:
    """Serve ``GET /metrics`` on ``port`` from a thread (a worker's metrics)."""
    start_http_server(port, addr=host, registry=REGISTRY)


def exposition() -> bytes:
    """The registry in Prometheus text format."""
    return generate_latest(REGISTRY)
