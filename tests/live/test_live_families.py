"""Live engines of the suite's releases x the tiny configs: kvcap derives exactly what each logged.

One real vLLM CPU server (DP=1) per (release, config: a tiny family or one of the varied
configs of `tools/live/varied.py`), with a `vllm_http` kvcap sidecar
reading `--model.config` beside it (`tools.live.matrix.observe`, the same observation
`make live-matrix` prints). The ground truth is the engine's own start-up line(s) and its
`vllm:cache_config_info` labels. A family a release refuses on this CPU must keep being
refused with the same error, so a release that learns it shows up here.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tools.live.matrix import Row, dump_row, observe
from tools.live.varied import CONFIG_SETS
from tools.live.vllm_install import LIVE_RELEASES

# (release, family) -> vLLM's error line on this CPU.
REFUSED: dict[tuple[str, str], re.Pattern[str]] = {
    ("0.27.0", "deepseek_mla"): re.compile(r"^NotImplementedError: MLA is not supported on CPU"),
}
# What `make test` runs: each KV layout the two deployments of test_live_capacity.py do
# not cover (sinks, chunked local, gated delta net, Mamba2 hybrid, MLA, Cohere2's window+1)
# on the newest release, and the families whose planning changed since on the older one;
# plus a sample of the varied configs (a head size, a window below the block, Mamba2 heads
# of 32 and the Qwen3-Next). One server start is 30-90 s on 2 cores;
# KVCAP_LIVE_FAMILIES=all runs every family and varied config on both releases.
MAKE_TEST_ROWS = (
    {
        (LIVE_RELEASES[0], config)
        for config in (
            "gpt_oss",
            "llama4",
            "qwen3_next",
            "nemotron_h",
            "deepseek_mla",
            "cohere2",
            "qwen3_next.head_dim=32",
            "gemma3.sliding_window=64",
            "nemotron_h.mamba_head_dim=32",
        )
    }
    | {("0.27.0", config) for config in ("gpt_oss", "qwen3_next", "phi3")}
    | {("0.27.0", "qwen3_next.head_dim=32")}
)
STARTING = [
    (r, c)
    for r in LIVE_RELEASES
    for c in CONFIG_SETS["all"]
    if (r, c) not in REFUSED
    and (os.environ.get("KVCAP_LIVE_FAMILIES") == "all" or (r, c) in MAKE_TEST_ROWS)
]


@pytest.fixture(scope="module", params=STARTING, ids=lambda case: f"{case[0]}-{case[1]}")
def row(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Row:
    release, name = request.param
    observed = observe(release, CONFIG_SETS["all"][name], tmp_path_factory.mktemp("family"))
    if os.environ.get("KVCAP_LIVE_ROWS"):  # the rows for `python -m tools.live.matrix --from-json`
        dump_row(observed, Path(os.environ["KVCAP_LIVE_ROWS"]))
    return observed


def test_engine_starts_and_logs_its_capacity(row: Row) -> None:
    assert row.started, row.log_lines
    assert row.logged_tokens is not None
    assert row.logged_concurrency is not None


def test_vllm_reports_what_it_logged(row: Row) -> None:
    # The premise of the others: vLLM's log line and its labels are the same numbers.
    assert row.info_tokens == row.logged_tokens, row
    assert row.info_concurrency is not None
    assert round(row.info_concurrency, 2) == row.logged_concurrency, row


def test_kvcap_reports_vllms_figures(row: Row) -> None:
    assert (row.reported_tokens, row.reported_concurrency) == (
        row.info_tokens,
        row.info_concurrency,
    ), row


def test_derived_capacity_equals_logged(row: Row) -> None:
    assert row.note == "", row.note  # no derivation error
    assert row.derived_tokens == row.logged_tokens, row
    assert row.mismatch == 0, row
    assert row.exact, row  # also the derived concurrency, where /engines gives it


@pytest.mark.parametrize("case", sorted(REFUSED), ids=lambda case: f"{case[0]}-{case[1]}")
def test_release_refuses_family_on_cpu(
    case: tuple[str, str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    release, model = case
    refused = observe(
        release, CONFIG_SETS["all"][model], tmp_path_factory.mktemp(f"refused-{release}-{model}")
    )
    if os.environ.get("KVCAP_LIVE_ROWS"):
        dump_row(refused, Path(os.environ["KVCAP_LIVE_ROWS"]))
    assert not refused.started, refused
    assert REFUSED[case].search(refused.log_lines[0]), refused.log_lines
