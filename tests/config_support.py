"""The one way tests build the service's configuration: hermetic, whatever else runs on the machine.

The service binds two TCP ports of its own, ``service.metrics_port`` (default 9108) and
``service.side_metrics_port`` (default 9109, the side paths' endpoint in ``process`` mode).  A test that kept a
default would fail whenever anything else on the machine (a ``stream-anon run``, another test run) holds it, so
every config built here turns both off (0) unless the test asks for an endpoint, on a free port
(:func:`stream_anon.kafka_io.broker.free_port`).  The environment's ``STREAM_ANON_*`` variables are ignored
(``env={}``): a developer's shell does not change what a test runs.

:func:`hermetic_config` is for tests that build a :class:`Config` in-process; :data:`NO_LISTENER_ARGS` is the
same for a ``stream-anon run``/``demo`` command line.  (Not called ``test_config``: pytest would collect a
function of that name imported into a test module as a test.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from stream_anon.config.settings import Config

# every port the service binds, off (a test that needs an endpoint passes a free port)
NO_LISTENERS: dict[str, int] = {"service.metrics_port": 0, "service.side_metrics_port": 0}
NO_LISTENER_ARGS: list[str] = ["--metrics-port", "0", "--set", "service.side_metrics_port=0"]


def bootstrap_of(broker: Any) -> str | None:
    """``broker.bootstrap_servers`` for a broker fixture, the string itself for a ``host:port`` string."""
    if broker is None or isinstance(broker, str):
        return broker
    return str(broker.bootstrap_servers)


def hermetic_config(broker: Any = None, options: Mapping[str, Any] | None = None, /, **more: Any) -> Config:
    """A validated :class:`Config` for a test: no metrics endpoint (main or side), ``kafka.bootstrap_servers``
    from ``broker`` (a broker fixture or a ``host:port`` string; None: unset), then ``options`` (dotted option ->
    value, as ``--set`` takes them) and ``more`` (``section__field=value``, for option names that are
    identifiers).  The environment is not read."""
    overrides: dict[str, Any] = dict(NO_LISTENERS)
    bootstrap = bootstrap_of(broker)
    if bootstrap is not None:
        overrides["kafka.bootstrap_servers"] = bootstrap
    overrides.update(options or {})
    overrides.update({name.replace("__", "."): value for name, value in more.items()})
    return Config.load(env={}, overrides=overrides)
