"""The metrics endpoint: a registry's Prometheus exposition on ``/metrics`` and a health check on ``/healthz``
(:func:`serve_metrics`), and a check that it can listen before anything else starts
(:func:`check_metrics_endpoint`)."""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable, Iterable
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app


class MetricsEndpointError(OSError):
    """The metrics endpoint cannot listen where it is configured (port in use, address not of this machine, no
    permission): a one-line message naming the option."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
        """No access log (the default writes a line per scrape to stderr)."""


Health = Callable[[], tuple[bool, str]]
"""() -> (healthy, one line): what ``/healthz`` answers (200 or 503, the line as body)."""


def metrics_app(registry: CollectorRegistry, health: Health | None = None) -> Callable[..., Iterable[bytes]]:
    """The endpoint's WSGI app: prometheus_client's exposition of ``registry`` (every path but ``/healthz``), and
    ``/healthz`` answered by ``health`` (404 without one)."""
    exposition = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != "/healthz":
            return exposition(environ, start_response)
        if health is None:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"no health check here\n"]
        ok, line = health()
        start_response("200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain; charset=utf-8")])
        return [line.encode() + b"\n"]

    return app


def serve_metrics(registry: CollectorRegistry, port: int, addr: str = "127.0.0.1", *, health: Health | None = None,
                  port_option: str = "service.metrics_port", addr_option: str = "service.metrics_addr") -> None:
    """Expose ``registry`` on ``http://addr:port/metrics`` (loopback by default), and ``health`` on ``/healthz``.

    Raises :class:`MetricsEndpointError` (an ``OSError``) naming ``port_option``/``addr_option`` when it cannot
    listen there.
    """
    try:
        family = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server_class = type("MetricsServer", (_Server,), {"address_family": family})
        httpd: WSGIServer = make_server(addr, port, metrics_app(registry, health), server_class, handler_class=_QuietHandler)
    except OSError as e:
        raise _endpoint_error(e, port, addr, port_option, addr_option) from None
    threading.Thread(target=httpd.serve_forever, name="metrics-http", daemon=True).start()


def check_metrics_endpoint(port: int, addr: str = "127.0.0.1", *, port_option: str = "service.metrics_port",
                           addr_option: str = "service.metrics_addr") -> None:
    """Raise :class:`MetricsEndpointError` if :func:`serve_metrics` could not listen on ``addr:port`` now.

    Binds (without listening) a socket the way the endpoint's HTTP server does (the address family
    ``getaddrinfo`` gives first, ``SO_REUSEADDR``) and closes it: a port another process listens on, an address
    that is not this machine's, or a privileged port are found before anything else starts.
    """
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((sockaddr[0], port))
    except OSError as e:
        raise _endpoint_error(e, port, addr, port_option, addr_option) from None


def _endpoint_error(e: OSError, port: int, addr: str, port_option: str, addr_option: str) -> MetricsEndpointError:
    """Why the metrics endpoint cannot listen on ``addr:port``, in one line naming the option to change."""
    if isinstance(e, socket.gaierror):
        text = f"option {addr_option}: cannot resolve {addr!r} ({e.strerror or e})"
    elif e.errno == errno.EADDRINUSE:
        text = (f"option {port_option}: port {port} on {addr} is already in use (another stream-anon, or another "
                f"program, listens there); choose a free port, or 0 to turn the metrics endpoint off")
    elif e.errno == errno.EADDRNOTAVAIL:
        text = f"option {addr_option}: {addr!r} is not an address of this machine (cannot listen on it)"
    elif e.errno == errno.EACCES:
        text = f"option {port_option}: no permission to listen on port {port} (ports below 1024 need privileges)"
    else:
        text = f"option {port_option}: cannot listen on {addr}:{port}: {e.strerror or e}"
    err = MetricsEndpointError(text)
    err.errno = e.errno
    return err
