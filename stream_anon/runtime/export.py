"""A run directory from what the service published (``stream-anon audit --run-dir DIR``): what ``stream-anon verify``
and ``stream-anon report`` read (format: docs/deploy.md, "The run directory").

Written from the ledger and the output topics (:class:`~stream_anon.service.audit.OutputSnapshot`):

* ``released.csv``: the public released table, what a reader of the anon topic gets (``class_id``, the QIs, the
  sensitive value(s); no record id), with its meta file ``released.csv.meta.json`` (the columns' roles, k, l);
* ``delays.json``: the released records' delays (arrivals and seconds, sorted) and the bound delta;
* ``summary.json``: the ledger's counts, the parameters, the loss and the independent k-/l- check of the table;
* ``schema.yaml`` (+ ``hierarchies/*.csv``): the schema of the released table (:func:`write_schema`);
* ``config.json``: the service's configuration, passwords and the release secret redacted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from stream_anon.core.loss import summarize_release_frame
from stream_anon.core.schema import Kind, Schema
from stream_anon.core.verify import ReleaseRoles, verify_release_frame, write_release_meta

if TYPE_CHECKING:
    from stream_anon.config.settings import Config
    from stream_anon.service.audit import OutputSnapshot

SCHEMA_FILE = "schema.yaml"
HIERARCHY_DIR = "hierarchies"


def write_schema(schema: Schema, out_dir: str | Path) -> Path:
    """``schema.yaml`` in ``out_dir`` with each hierarchy beside it in ``hierarchies/<attribute>.csv`` (the ARX
    layout): a copy of the schema that loads on its own, wherever the original files were."""
    d = Path(out_dir)
    attributes: list[dict[str, Any]] = []
    for a in schema.attributes:
        spec: dict[str, Any] = {"name": a.name, "role": a.role.value, "type": a.kind.value}
        if a.kind is Kind.NUMERIC and a.lo is not None and a.hi is not None:
            spec["domain"] = [a.lo, a.hi]
        if a.integer:
            spec["integer"] = True
        if a.hierarchy is not None:
            (d / HIERARCHY_DIR).mkdir(parents=True, exist_ok=True)
            name = f"{HIERARCHY_DIR}/{a.name}.csv"
            (d / name).write_text(a.hierarchy.to_csv_text(), encoding="utf-8")
            spec["hierarchy"] = name
        elif a.values is not None:
            spec["values"] = list(a.values)
        if a.source:
            spec["source"] = a.source
        if a.side_paths:
            spec["side_paths"] = list(a.side_paths)
        attributes.append(spec)
    doc = {"name": schema.name, "record_id": schema.record_id, "person_id": schema.person_id,
           "missing": schema.missing, "attributes": attributes}
    path = d / SCHEMA_FILE
    path.write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return path


def summarize_snapshot(cfg: Config, schema: Schema, snap: OutputSnapshot, *, source: str) -> dict[str, Any]:
    """``summary.json`` of a snapshot: the ledger's counts, the parameters, the loss of the released records and
    the independent check of the public table (k, l, the QI strings against the schema)."""
    a, t = cfg.anonymization, cfg.topics
    qis = [q.name for q in schema.qis]
    sens = [s.name for s in schema.sensitive]
    acc = snap.accounting
    df = snap.records
    released = df[df.outcome == "released"]
    suppressed = acc.outcomes.get("suppressed", 0)
    members = released[["record_id", "class_id", *qis]].astype({"record_id": str})
    loss = summarize_release_frame(members, schema, a.k, records_suppressed=suppressed) if len(members) else None
    req = a.requirement(schema)
    check = verify_release_frame(snap.public, qis, a.k, None, sens[0] if sens else None, record_id=None,
                                 schema=schema, requirement=req,
                                 references=snap.references if req is not None and req.t is not None else None
                                 ) if len(snap.public) else None
    return {
        "data_source": source,
        "synthetic": False,
        "parameters": {"k": a.k, "delta": a.delta, "beta": a.beta, "mu": a.mu, "algorithm": a.algorithm,
                       "loss": a.loss, "leftover": a.leftover, "l": a.l, "diversity": a.diversity, "c": a.c,
                       "t_closeness": a.t_closeness, "zeta": a.zeta},
        "records_in": acc.accounted - acc.outcomes.get("control", 0) + len(acc.missing),
        "records_released": acc.outcomes.get("released", 0),
        "records_suppressed": suppressed,
        "records_dead_lettered": acc.outcomes.get("dead_lettered", 0),
        "records_unaccounted": len(acc.missing),
        "records_duplicated": len(acc.duplicates),
        "end_of_stream_markers": acc.outcomes.get("control", 0),
        "suppressed_reasons": dict(acc.suppressed_reasons),
        "dead_letter_reasons": dict(acc.dlq_reasons),
        "classes": snap.classes,
        "accounting": {"ok": bool(snap.ok), "source": f"ledger {t.ledger_topic()}",
                       "published_exactly_once": {role: c.ok for role, c in snap.published.items()},
                       "problems": snap.problems[:20]},
        "loss": loss.as_dict() if loss is not None else None,
        "gt_loss": float(loss.gt_loss) if loss is not None else None,
        "lm_loss": float(loss.lm_loss) if loss is not None else None,
        "lm_loss_normalized": float(loss.lm_loss_normalized) if loss is not None else None,
        "k_anonymity": {"verified": bool(check is not None and check.ok), "l": a.l,
                        "violations": list(check.violations)[:20] if check is not None else [],
                        "classes": check.classes if check is not None else 0,
                        "min_class_size": check.min_class_size if check is not None else None,
                        "size_unit": "records" if schema.person_id else "records (= individuals)"},
        "topics": {"input": t.input, **t.outputs(), "ledger": t.ledger_topic()},
        "files": {"released_csv": "released.csv", "released_meta": "released.csv.meta.json", "delays": "delays.json",
                  "schema": SCHEMA_FILE, "config": "config.json"},
    }


def write_run_directory(out_dir: str | Path, cfg: Config, schema: Schema, snap: OutputSnapshot, *,
                        source: str) -> Path:
    """Write the run directory of ``snap`` (see the module docstring) into ``out_dir``; returns it."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    a = cfg.anonymization
    qis = [q.name for q in schema.qis]
    sens = [s.name for s in schema.sensitive]
    snap.public.to_csv(d / "released.csv", index=False)
    roles = ReleaseRoles(class_id="class_id", quasi_identifiers=tuple(qis), sensitive=tuple(sens),
                         source="stream-anon audit", withheld_person_id=schema.person_id)
    write_release_meta(d / "released.csv", roles, schema=schema.name, k=a.k, l=a.l, records=len(snap.public),
                       classes=snap.classes, class_size_counts="records" if schema.person_id is None else
                       f"records (the schema's person id {schema.person_id!r} is not released)",
                       row_order="release order of the classes; rows of a class by sensitive value",
                       class_ids="opaque random 128-bit ids (the anon topic's)")
    released = snap.records[snap.records.outcome == "released"]
    delays: dict[str, Any] = {"bound": a.delta, "population": "released records, sorted",
                              "arrivals": sorted(int(x) for x in released["delay"].dropna()),
                              "seconds": sorted(float(x) for x in released["latency_s"].dropna())}
    (d / "delays.json").write_text(json.dumps(delays) + "\n", encoding="utf-8")
    write_schema(schema, d)
    summary = summarize_snapshot(cfg, schema, snap, source=source)
    (d / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n", encoding="utf-8")
    (d / "config.json").write_text(json.dumps(cfg.redacted(), indent=2, default=str) + "\n", encoding="utf-8")
    return d
