"""Benchmarks (``stream-anon bench NAME``); each module has ``main(argv) -> int``."""
