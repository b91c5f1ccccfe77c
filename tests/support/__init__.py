"""What tests share: waiting, ports and scrapes (from `tools.probe`), and the CLI launcher.

One of each, so a change to how the suite waits, scrapes or starts `kvcap-exporter` is one edit.
"""

from tests.support.launch import cli_command
from tools.probe import Scrape, fetch, free_port, parse, scrape, wait_for, wait_timed

__all__ = [
    "Scrape",
    "cli_command",
    "fetch",
    "free_port",
    "parse",
    "scrape",
    "wait_for",
    "wait_timed",
]
