"""Print the lowest versions pyproject.toml allows, pinned (``name>=1.2`` -> ``name==1.2``), one per line.

Used by ``scripts/check_dependency_floors.sh``; ``--extra NAME`` adds the floors of an optional-dependency group.
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def floors(requirements: list[str]) -> list[str]:
    out = []
    for req in requirements:
        m = re.match(r"^\s*([A-Za-z0-9_.\-\[\]]+)\s*(.*)$", req)
        assert m, req
        name, spec = m.group(1), m.group(2)
        low = re.search(r">=\s*([0-9][^,;\s]*)", spec)
        pin = re.search(r"==\s*([0-9][^,;\s]*)", spec)
        out.append(f"{name}=={low.group(1)}" if low else f"{name}=={pin.group(1)}" if pin else name)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--extra", action="append", default=[])
    args = ap.parse_args()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = list(project["dependencies"])
    for extra in args.extra:
        reqs += project["optional-dependencies"][extra]
    print("\n".join(floors(reqs)))


if __name__ == "__main__":
    main()
