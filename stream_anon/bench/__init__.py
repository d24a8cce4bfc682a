"""Benchmarks (``stream-anon bench NAME``); each module has ``main(argv) -> int``."""

from __future__ import annotations

import sys

from stream_anon.kafka_io.address import DEFAULT_CONNECT_SECONDS


def broker_problem(prog: str, bootstrap_servers: str | None, timeout_s: float = DEFAULT_CONNECT_SECONDS) -> int:
    """0 when ``bootstrap_servers`` is None (the benchmark starts its own broker) or a broker accepts connections
    there within ``timeout_s``; else one line on stderr and the exit code: 2 for a malformed address (before
    anything connects), 3 for an unreachable one."""
    from stream_anon.kafka_io.address import BootstrapAddressError, BrokerUnreachableError, wait_for_broker

    if bootstrap_servers is None:
        return 0
    try:
        wait_for_broker(bootstrap_servers, timeout_s)
    except BootstrapAddressError as e:
        print(f"{prog}: --bootstrap-servers: {e}", file=sys.stderr)
        return 2
    except BrokerUnreachableError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 3
    return 0
