"""`make bench`: every benchmark, one table, and bench-results.json with the same rows."""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import time
from pathlib import Path

from benchmarks.common import Row, print_rows

# Each module has rows() -> list[Row]; the order is the order of the table.
MODULES = ("scrape", "parse", "handshake", "daemon", "capacity", "nvml", "kv_events")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", type=Path, default=Path("bench-results.json"))
    args = parser.parse_args()
    began = time.monotonic()
    rows: list[Row] = []
    for name in MODULES:
        try:
            module = importlib.import_module(f"benchmarks.{name}")
        except ModuleNotFoundError:
            continue
        if hasattr(module, "rows"):
            rows.extend(module.rows())
    print_rows(rows)
    failed = [row.figure for row in rows if row.passed is False]
    print(
        f"\n{len(rows)} figures, {sum(r.passed is True for r in rows)} pass, "
        f"{len(failed)} fail, {time.monotonic() - began:.0f} s"
    )
    args.json.write_text(
        json.dumps(
            {
                "machine": {
                    "python": platform.python_version(),
                    "cpus": __import__("os").cpu_count(),
                    "platform": platform.platform(),
                },
                "rows": [row.as_dict() for row in rows],
            },
            indent=2,
        )
        + "\n"
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
