"""`kvcap-exporter nvml-check` from a checkout (the command is the one to run; this stays for
the runbooks that name the script). Same flags, same exit status."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout

from exporter.cli import main

if __name__ == "__main__":
    sys.exit(main(["nvml-check", *sys.argv[1:]]))
