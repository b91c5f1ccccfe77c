"""What tests share: waiting, ports and scrapes (from `tools.probe`), the CLI launcher and
script loader.

One of each, so a change to how the suite waits, scrapes or starts `kvcap-exporter` is one edit.
"""

from tests.support.launch import cli_command
from tests.support.scripts import load_script
from tools.probe import Scrape, fetch, free_port, parse, scrape, wait_for, wait_timed

__all__ = [
    "Scrape",
    "cli_command",
    "fetch",
    "free_port",
    "load_script",
    "parse",
    "scrape",
    "wait_for",
    "wait_timed",
]
