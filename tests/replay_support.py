"""Test data of the replay tests: a user's own schema (record id field ``patient_ref``) and a CSV for it."""

from __future__ import annotations

from pathlib import Path

CLINIC_SCHEMA = """\
name: clinic
record_id: patient_ref
attributes:
  - {name: age, role: quasi_identifier, type: numeric, domain: [0, 120], integer: true}
  - {name: zip, role: quasi_identifier, type: categorical, hierarchy: zip.csv}
  - {name: weight, role: other, type: numeric, domain: [0, 300]}
  - {name: diagnosis, role: sensitive, type: categorical, values: [flu, cold, asthma]}
"""
ZIP_HIERARCHY = "10115;101**;*\n10117;101**;*\n10243;102**;*\n10245;102**;*\n"


def write_clinic(tmp_path: Path, n: int = 40, *, id_column: str = "patient_ref") -> tuple[Path, Path]:
    """A custom schema whose record id field is ``patient_ref``, and a CSV of ``n`` rows with an extra column."""
    (tmp_path / "zip.csv").write_text(ZIP_HIERARCHY)
    schema = tmp_path / "clinic.yaml"
    schema.write_text(CLINIC_SCHEMA)
    zips = ["10115", "10117", "10243", "10245"]
    diagnoses = ["flu", "cold", "asthma"]
    lines = [f"{id_column},age,zip,weight,diagnosis,notes"]
    for i in range(n):
        lines.append(f"P{i:04d}, {20 + i % 50},{zips[i % 4]},{60 + (i % 7) * 2.5},{diagnoses[i % 3]},free text {i}")
    csv_path = tmp_path / "clinic.csv"
    csv_path.write_text("\n".join(lines) + "\n")
    return csv_path, schema
