"""Hold TCP ports while a command runs: the proof that the tests depend on no fixed port (issue 16).

    python scripts/hold_ports.py 9092 9108 9109 -- bash scripts/test.sh --fast

Listens on each port on every IPv4 address (``0.0.0.0``) and, where the machine has IPv6, on ``::`` (as Kafka's
9092 or a running ``stream-anon``'s metrics endpoints 9108 and 9109 would), runs the command, and exits with its
exit code.  A port another process already holds is busy all the same: it is reported and the command runs.
The sockets are not inherited by the command (Python's sockets are non-inheritable).
"""

from __future__ import annotations

import argparse
import errno
import socket
import subprocess
import sys


def hold(port: int) -> tuple[list[socket.socket], str]:
    """Listening sockets on ``port`` (IPv4 wildcard, and IPv6 wildcard where available), and what was done."""
    held: list[socket.socket] = []
    notes = []
    for family, addr in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET6, "::")):
        if family == socket.AF_INET6 and not socket.has_ipv6:
            continue
        s = socket.socket(family, socket.SOCK_STREAM)
        try:
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind((addr, port))
            s.listen()
        except OSError as e:
            s.close()
            if e.errno == errno.EADDRINUSE:
                notes.append(f"{addr}: already held by another process")
            elif family == socket.AF_INET6:
                notes.append(f"{addr}: no IPv6 ({e.strerror})")
            else:
                raise SystemExit(f"hold_ports: cannot listen on {addr}:{port}: {e.strerror}") from None
        else:
            held.append(s)
            notes.append(f"{addr}: listening")
    return held, "; ".join(notes)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(usage="%(prog)s PORT [PORT ...] -- COMMAND [ARG ...]",
                                     description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("ports", nargs="+", type=int, metavar="PORT", help="TCP ports to hold")
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        parser.error("no command to run (put it after --)")
    split = argv.index("--")
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    sockets: list[socket.socket] = []
    for port in args.ports:
        held, note = hold(port)
        sockets += held
        print(f"hold_ports: port {port}: {note}", file=sys.stderr, flush=True)
    try:
        return subprocess.call(command)
    except KeyboardInterrupt:
        return 130
    finally:
        for s in sockets:
            s.close()


if __name__ == "__main__":
    sys.exit(main())
