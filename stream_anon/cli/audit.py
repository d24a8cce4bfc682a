"""``stream-anon audit``: account for every input offset from the internal ledger, and check every promised output
against its topic (:mod:`stream_anon.service.audit`)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from stream_anon.cli.service import add_config_flags, config_from_args
from stream_anon.config.settings import ConfigError
from stream_anon.service.audit import audit_lines, collect_outputs, partition_ends


def register(sub: Any) -> None:
    p = sub.add_parser("audit", help="account for every input record from the ledger (exit 1 if one is not)",
                       description="Read the ledger <input>.ledger and the anon, suppressed and dlq topics: every "
                                   "input offset must be released, suppressed, dead-lettered or an end-of-stream "
                                   "marker exactly once, and every promised output published exactly once. Run it "
                                   "when the service has drained its input (offsets it has not reached yet are "
                                   "reported as not accounted). Exit 0: all holds; 1: it does not; 2: usage.")
    add_config_flags(p, include=("--bootstrap-servers", "--input-topic", "--schema"))
    p.set_defaults(func=_audit)


def _audit(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        print(f"stream-anon audit: {e}", file=sys.stderr)
        return 2
    bs = cfg.kafka.bootstrap_servers
    if not bs:
        print("stream-anon audit: --bootstrap-servers (or kafka.bootstrap_servers) is required", file=sys.stderr)
        return 2
    schema = cfg.anonymization.load_schema()
    t, opts = cfg.topics, cfg.kafka.security_options()
    snap = collect_outputs(bs, input_topic=t.input, ledger=t.ledger_topic(), anon=t.anon, suppressed=t.suppressed,
                           dlq=t.dlq, qis=[a.name for a in schema.qis], sensitive=[a.name for a in schema.sensitive],
                           input_ends=partition_ends(bs, t.input, client_options=opts), client_options=opts)
    print("\n".join(audit_lines(snap)))
    return 0 if snap.ok else 1
