"""The UDP bridge's loss counters, read from its Prometheus endpoint (the sender cannot see losses).

UDP drops datagrams silently, so the sender only knows what it sent.  The bridge counts the loss by
sequence number (``stream_anon_udp_gaps_total``: a gap becomes final when it leaves the reordering window
or when the stream closes, EOS count included).  :func:`wait_for_stream_loss` scrapes the counters before
and after one stream and returns the difference: records forwarded, lost (gaps) and duplicated.  The
difference is this stream's only if no other sender used the bridge meanwhile.
"""

from __future__ import annotations

import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

UDP_COUNTERS: dict[str, str] = {
    "received": "stream_anon_udp_datagrams_received_total",
    "forwarded": "stream_anon_udp_records_forwarded_total",
    "gaps": "stream_anon_udp_gaps_total",
    "duplicates": "stream_anon_udp_duplicates_total",
    "malformed": "stream_anon_udp_malformed_total",
}


class BridgeMetricsError(RuntimeError):
    """The bridge's metrics endpoint cannot be read, or does not export the UDP counters."""


@dataclass(frozen=True)
class BridgeCounters:
    """The bridge's UDP counters at one scrape (or the difference of two scrapes)."""

    received: int
    forwarded: int
    gaps: int
    duplicates: int
    malformed: int

    def __sub__(self, other: BridgeCounters) -> BridgeCounters:
        return BridgeCounters(self.received - other.received, self.forwarded - other.forwarded,
                              self.gaps - other.gaps, self.duplicates - other.duplicates,
                              self.malformed - other.malformed)


def metrics_url(url: str) -> str:
    """``HOST:PORT``, ``http://HOST:PORT`` or a full URL -> the URL of the ``/metrics`` page."""
    if "://" not in url:
        url = "http://" + url
    parts = urllib.parse.urlsplit(url)
    if parts.path in ("", "/"):
        parts = parts._replace(path="/metrics")
    return urllib.parse.urlunsplit(parts)


def parse_bridge_counters(text: str, *, source: str = "metrics") -> BridgeCounters:
    """The UDP counters from a Prometheus text page; :class:`BridgeMetricsError` if one is missing."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = sample.value
    missing = [name for name in UDP_COUNTERS.values() if name not in values]
    if missing:
        raise BridgeMetricsError(f"{source} has no {', '.join(missing)}: is it the metrics endpoint of "
                                 "`stream-anon udp-bridge` (--metrics-port)?")
    return BridgeCounters(**{key: int(values[name]) for key, name in UDP_COUNTERS.items()})


def scrape_bridge_counters(url: str, *, timeout_s: float = 5.0) -> BridgeCounters:
    """Read the bridge's UDP counters from ``url`` (see :func:`metrics_url`)."""
    full = metrics_url(url)
    try:
        with urllib.request.urlopen(full, timeout=timeout_s) as resp:  # noqa: S310  (an operator-given URL)
            text = resp.read().decode("utf-8", errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise BridgeMetricsError(f"cannot read the bridge's metrics at {full}: {e}") from None
    return parse_bridge_counters(text, source=full)


@dataclass(frozen=True)
class BridgeLoss:
    """One stream's accounting as the bridge's counters saw it."""

    url: str
    count: int  # records of the stream (the sender's sequence numbers, = the EOS count)
    forwarded: int
    gaps: int
    duplicates: int
    final: bool  # forwarded + gaps reached count: the bridge has closed the stream
    gone: bool = False  # the endpoint stopped answering before the stream was accounted for

    @property
    def loss_pct(self) -> float:
        return 100.0 * self.gaps / self.count if self.count else 0.0

    def summary(self) -> str:
        if self.final:
            return (f"bridge ({self.url}): {self.forwarded:,} of {self.count:,} records forwarded, {self.gaps:,} lost "
                    f"({self.loss_pct:.2f} %, counted by the bridge as gaps), {self.duplicates:,} duplicates dropped")
        if self.gone:
            return (f"bridge ({self.url}): the metrics endpoint stopped answering before the bridge had accounted for "
                    f"the stream (a bridge started with --exit-on-eos exits then): its own report has the loss; "
                    f"last reading: {self.forwarded:,} of {self.count:,} records forwarded, {self.gaps:,} counted lost")
        return (f"bridge ({self.url}): so far {self.forwarded:,} of {self.count:,} records forwarded and {self.gaps:,} "
                f"counted lost; the bridge has not closed the stream yet (EOS not received?), so the loss is not "
                f"final: see stream_anon_udp_gaps_total later")


def wait_for_stream_loss(url: str, before: BridgeCounters, count: int, *, timeout_s: float = 10.0,
                         poll_s: float = 0.1, clock: Callable[[], float] = time.monotonic,
                         sleep: Callable[[float], object] = time.sleep,
                         scrape: Callable[[str], BridgeCounters] = scrape_bridge_counters) -> BridgeLoss:
    """Scrape until the bridge accounted for all ``count`` records of the stream sent since ``before``
    (forwarded + gaps >= count: it closed the stream) or ``timeout_s`` passed; the difference to ``before``.

    An endpoint that stops answering (the bridge exited) ends the wait with the last reading (``gone``).
    """
    deadline = clock() + timeout_s
    d = BridgeCounters(0, 0, 0, 0, 0)
    while True:
        try:
            d = scrape(url) - before
        except BridgeMetricsError:
            return BridgeLoss(url=metrics_url(url), count=count, forwarded=d.forwarded, gaps=d.gaps,
                              duplicates=d.duplicates, final=False, gone=True)
        done = d.forwarded + d.gaps >= count
        if done or clock() >= deadline:
            return BridgeLoss(url=metrics_url(url), count=count, forwarded=d.forwarded, gaps=d.gaps,
                              duplicates=d.duplicates, final=done)
        sleep(poll_s)
