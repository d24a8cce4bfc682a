"""stream-anon: real-time anonymization of record streams.

Packages in layers, bottom to top (a package imports only its own layer or below; ``tests/test_import_graph.py``):
``core`` (schemas, hierarchies, loss metrics, the CASTLE/UBDSA engine), ``privacy`` (local differential privacy
mechanisms) and ``formats`` (message formats) are pure: they import neither Kafka nor Prometheus.  ``kafka_io``
(Kafka clients, producer, embedded broker) and ``metrics`` are the plumbing; ``config`` the one configuration
object; ``service`` (the main path), ``side`` (the side paths), ``replay`` and ``report`` sit side by side on top
of them; ``runtime`` starts both paths; ``cli`` and ``bench`` are the entry points.
"""

__version__ = "0.1.0"
