"""What the side paths report about themselves: :class:`SideStatus`, the running totals of one side-path member (the
demo summary, the side process's ``/healthz`` and the tests read them), :func:`estimate_summary` and the
:func:`startup_warnings` of a configuration."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from stream_anon.config.side_paths import SidePathConfig
from stream_anon.formats.release import ReleaseOptions


@dataclass
class SideStatus:
    """Running totals of the side paths in this process (the demo summary and tests read them)."""

    consumed: int = 0  # input messages consumed by the side group
    processed: int = 0  # valid records perturbed
    control: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count (bad input, person cap, commit failures)
    clipped: dict[str, int] = field(default_factory=dict)  # attribute -> out-of-domain values clipped
    published: dict[str, int] = field(default_factory=dict)  # topic -> messages acknowledged
    kmeans_budget: dict[str, float] | None = None  # the k-means lifetime budget: total, used, remaining (if any)
    epsilon_per_record: dict[str, float] = field(default_factory=dict)  # per-record topic -> a record's exact eps
    epsilon_kmeans_window: float = 0.0  # exact eps of one k-means window (each record is in one)
    epsilon_all_side_topics: float = 0.0  # one record's exact eps over all side outputs, k-means included
    estimates: dict[str, dict[str, Any]] = field(default_factory=dict)  # "mech/attr" -> latest summary
    kmeans_windows: int = 0
    kmeans_refused: int = 0
    mixing_windows: int = 0  # windows of copies released
    outbox_entries: int = 0  # write-ahead entries written (one per send of a window or a batch's outputs)
    outbox_wait_seconds: float = 0.0  # time spent writing them ahead (the latency the write-ahead adds)
    outbox_recovered: int = 0  # messages the start's recovery sent again (left by the last run)
    budget_generation: int = 0  # the budget's generation (docs/side-paths.md, "Budgets")
    kmeans_stopped: bool = False
    positions: dict[int, int] = field(default_factory=dict)  # partition -> next offset (committed)
    group_id: str = ""
    ready: threading.Event = field(default_factory=threading.Event)
    finished: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    last_tick: float = field(default_factory=time.monotonic)  # the loop's last iteration (or the start)

    def tick(self) -> None:
        self.last_tick = time.monotonic()

    def health(self, stall_seconds: float) -> tuple[bool, str]:
        """(healthy, one line) for the side-path process's ``/healthz``: unhealthy when the side paths failed,
        finished, or their loop has not turned for ``stall_seconds`` (``service.healthz_stall_seconds``)."""
        age = time.monotonic() - self.last_tick
        if self.error is not None:
            return False, f"failed: side paths stopped: {self.error}"
        if self.finished.is_set():
            return False, "stopped: the side paths have finished"
        if age > stall_seconds:
            return False, (f"stalled: the side-path loop has not turned for {age:.0f} s (bound "
                           f"service.healthz_stall_seconds = {stall_seconds:g})")
        state = "running" if self.ready.is_set() else "starting"
        return True, f"ok: side paths {state}, loop turned {age:.1f} s ago, {self.processed:,} records perturbed"

    def summary(self) -> dict[str, Any]:
        """The totals as plain data (JSON, pickling across processes)."""
        return {"consumed": self.consumed, "processed": self.processed, "skipped": dict(self.skipped),
                "clipped": dict(self.clipped), "published": dict(self.published),
                "epsilon_per_record": dict(self.epsilon_per_record), "kmeans_budget": self.kmeans_budget,
                "epsilon_kmeans_window": self.epsilon_kmeans_window,
                "epsilon_all_side_topics": self.epsilon_all_side_topics, "estimates": dict(self.estimates),
                "kmeans_windows": self.kmeans_windows, "kmeans_refused": self.kmeans_refused,
                "mixing_windows": self.mixing_windows, "outbox_entries": self.outbox_entries,
                "outbox_wait_seconds": round(self.outbox_wait_seconds, 3), "outbox_recovered": self.outbox_recovered,
                "budget_generation": self.budget_generation,
                "kmeans_stopped": self.kmeans_stopped, "group_id": self.group_id, "error": self.error,
                "control": self.control}


def estimate_summary(msg: dict[str, Any]) -> dict[str, Any]:
    """The summary of one estimate message that :attr:`SideStatus.estimates` keeps."""
    out: dict[str, Any] = {"source_topic": msg["source_topic"], "type": msg["type"], "n": msg["n"],
                           "epsilon": msg["epsilon"], "standard_error": msg.get("standard_error"),
                           "round": msg["round"]}
    if msg["type"] == "mean":
        out["mean"] = msg["mean"]
    truth = msg.get("truth")
    if truth is not None:
        out["abs_error"] = truth.get("abs_error")
    return out


def startup_warnings(side: SidePathConfig, *, secret_generated: bool, epsilon_all_topics: float) -> list[str]:
    """Lines the side paths log as WARNING at start: seeded noise, a generated pseudonym secret, copies without
    pseudonyms, no lifetime cap, small mixing windows."""
    out = []
    if side.seed is not None:
        out.append(f"side_paths.seed is set ({side.seed}) with side_paths.allow_seeded_noise: every perturbation of "
                   f"the side paths is reproducible by whoever knows the seed; tests and benchmarks only")
    if side.pseudonyms and secret_generated:
        out.extend(ReleaseOptions().startup_warnings(secret_generated=True))
    if not side.pseudonyms:
        m = side.mixing
        out.append(f"side_paths.pseudonyms is false: side copies carry no key and no id; each topic's copies leave in "
                   f"windows of {m.records} records (or what arrived in {m.seconds:g} s), in an independent random "
                   f"order: within a window, positions do not join one record's copies across topics, but a window "
                   f"holding ONE record (a quiet partition) joins them by its timestamp")
    if side.person_budget.cap_epsilon is None:
        out.append("side_paths.person_budget.cap_epsilon is null: no lifetime cap; every pass over the same records "
                   f"(a replay, another consumer group) spends {epsilon_all_topics!r} again per record")
    if side.mixing.records < 100:
        out.append(f"side_paths.mixing.records is {side.mixing.records}: a copy's position places it among that few "
                   f"records of its window")
    return out
