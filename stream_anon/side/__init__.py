"""Local-differential-privacy side paths: options (config), channels, the pure processor, encoding, metrics and the
Kafka loop (app).  See docs/side-paths.md."""
