"""stream-anon: real-time anonymization of record streams.

``stream_anon.core`` (schemas, hierarchies, loss metrics, the CASTLE/UBDSA engine) and
``stream_anon.privacy`` (local differential privacy mechanisms) are pure: they import neither
Kafka nor Prometheus.  ``stream_anon.service`` is the Kafka/Prometheus shell around them.
"""

__version__ = "0.1.0"
