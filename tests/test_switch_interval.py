"""The interpreter's switch interval is the daemon's to set, as its main sets up the process."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

from exporter.serve import SWITCH_INTERVAL_S, Exporter, WebSettings, set_switch_interval


@pytest.fixture
def interval_restored() -> Iterator[float]:
    before = sys.getswitchinterval()
    yield before
    sys.setswitchinterval(before)


def test_an_exporter_built_inside_a_process_leaves_its_switch_interval(
    interval_restored: float,
) -> None:
    """Tests and benchmarks build Exporters in their own process: no retuning behind them."""
    sys.setswitchinterval(0.004)
    exporter = Exporter([], WebSettings("127.0.0.1:0"))
    exporter.start()
    try:
        assert sys.getswitchinterval() == pytest.approx(0.004)
    finally:
        exporter.stop()


def test_the_daemons_setting_bounds_each_wait_for_the_lock_below_pythons_default(
    interval_restored: float,
) -> None:
    set_switch_interval()
    assert sys.getswitchinterval() == pytest.approx(SWITCH_INTERVAL_S)
    assert sys.getswitchinterval() < 0.005  # Python's default, what a scrape waited before
