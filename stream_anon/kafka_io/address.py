"""Broker addresses: a malformed one is refused before anything connects (``parse_bootstrap_servers``, in
:mod:`stream_anon.kafka_io.settings` so that the configuration can check it without this module), an
unreachable one is found within a bounded wait by a plain TCP probe (:func:`wait_for_broker`), before a Kafka
client is made (a kafka-python client facing an unreachable address blocks for ``request_timeout_ms`` and logs
a line per attempt; a malformed one raises a ``ValueError`` from deep inside the client).

Every command that takes ``--bootstrap-servers`` uses both: ``run``/``demo``/``audit``/``bench`` through the
``kafka.bootstrap_servers`` option (:class:`~stream_anon.config.settings.Config` validates it at load), the replay
tools through their flag.  The probe's wait is the command's documented connect timeout
(:data:`DEFAULT_CONNECT_SECONDS` for the tools; ``kafka.connect_timeout_ms`` per attempt for ``run``, which retries
for ``kafka.startup_retry_seconds``); it looks at ``stop`` (and lets ``KeyboardInterrupt`` through) at least every
:data:`PROBE_SLICE_SECONDS`, so a Ctrl-C during the wait ends it at once.
"""

from __future__ import annotations

import errno
import socket
import time
from collections.abc import Callable

from stream_anon.kafka_io.settings import BootstrapAddressError as BootstrapAddressError
from stream_anon.kafka_io.settings import parse_bootstrap_servers

DEFAULT_CONNECT_SECONDS = 30.0
"""How long ``audit``, ``demo``, ``bench`` and the replay tools wait for a broker to accept a connection (their
``--connect-timeout``) before they give up with one line naming the address (exit code 3)."""
PROBE_SLICE_SECONDS = 0.25
"""The longest the probe blocks at a time (one connection attempt or one pause) before it looks at ``stop``."""

class BrokerUnreachableError(ConnectionError):
    """No broker accepted a TCP connection at any of the addresses within the wait (one line naming them);
    ``reason`` is what the connections met (``connection refused``, ``no answer``, ``name not resolved``)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


def _reason(e: OSError) -> str:
    if isinstance(e, socket.gaierror):
        return "name not resolved"
    if isinstance(e, TimeoutError | socket.timeout):
        return "no answer"
    if e.errno == errno.ECONNREFUSED:
        return "connection refused"
    return e.strerror or type(e).__name__


def wait_for_broker(bootstrap_servers: str, timeout_s: float, *, stop: Callable[[], bool] | None = None,
                    option: str = "--connect-timeout", once: bool = False) -> None:
    """Return as soon as one address of ``bootstrap_servers`` accepts a TCP connection; raise
    :class:`BrokerUnreachableError` (naming the addresses, the wait and ``option``, the setting that bounds it)
    after ``timeout_s``, or :class:`InterruptedError` as soon as ``stop()`` is true.  ``once``: give up after
    the first round in which every address refused the connection or did not resolve (the caller retries with
    its own backoff); an address that does not answer is still given ``timeout_s``."""
    addresses = parse_bootstrap_servers(bootstrap_servers)
    deadline = time.monotonic() + max(0.0, timeout_s)
    while True:
        reasons: dict[str, str] = {}
        for host, port in addresses:
            if stop is not None and stop():
                raise InterruptedError(f"stopped while waiting for broker {bootstrap_servers}")
            remaining = deadline - time.monotonic()
            try:
                with socket.create_connection((host, port), timeout=max(0.05, min(PROBE_SLICE_SECONDS, remaining))):
                    return
            except OSError as e:
                reasons[f"{host}:{port}"] = _reason(e)
        final = once and all(r in ("connection refused", "name not resolved") for r in reasons.values())
        if final or time.monotonic() >= deadline:
            why = "; ".join(sorted(set(reasons.values())))
            within = "" if final else f" within {timeout_s:g} s"
            raise BrokerUnreachableError(f"broker {bootstrap_servers} unreachable: no connection{within} ({why}; "
                                         f"{option})", why)
        if stop is not None and stop():
            raise InterruptedError(f"stopped while waiting for broker {bootstrap_servers}")
        time.sleep(max(0.0, min(PROBE_SLICE_SECONDS, deadline - time.monotonic())))
