"""`make live-matrix`: every runnable vLLM release x every tiny config, vLLM beside kvcap.

For each (release, config: a tiny family, or one of `varied.py`'s swept configs) it starts
one real vLLM CPU server (DP=1) and one kvcap sidecar (`vllm_http` collector,
`--model.config` at the model folder), and prints one row: vLLM's start-up capacity
line(s) verbatim, its `vllm:cache_config_info` figures, kvcap's reported and derived
figures, and whether kvcap's derivation is exact (derived == logged, mismatch 0). A
config a release refuses on this CPU gets a row with vLLM's error line. One server
at a time; each takes both cores for 30-90 s, so the whole matrix takes tens of minutes.

    python -m tools.live.matrix [--markdown] [--release 0.32.0] [--family gemma3] [--json F]
    python -m tools.live.matrix --configs varied|all [--config qwen3_next.head_dim=32]
    python -m tools.live.matrix --markdown --from-json F   # the table of rows written before

`KVCAP_LIVE_ROWS=F pytest tests/live/test_live_families.py` writes the live test's rows
(the same observation) to F too, so one live run gives both the verdicts and the table.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tools.live.models import TINY_MODELS, write_model
from tools.live.server import VllmServer, error_line
from tools.live.sidecar import Sidecar, wait_for
from tools.live.varied import CONFIG_SETS, LiveConfig
from tools.live.vllm_install import MATRIX_RELEASES, vllm_python
from tools.probe import parse

POLL_INTERVAL_S = 0.5


@dataclass(frozen=True)
class Row:
    """What one (release, family) live engine showed, vLLM's side and kvcap's."""

    release: str
    model: str
    started: bool
    log_lines: tuple[str, ...]  # vLLM's capacity line(s), or its error line
    logged_tokens: int | None = None
    logged_concurrency: float | None = None  # as printed: two decimals
    info_tokens: int | None = None  # vllm:cache_config_info kv_cache_size_tokens
    info_concurrency: float | None = None  # ... kv_cache_max_concurrency, full precision
    block_size: int | None = None
    reported_tokens: int | None = None  # kvcap_kv_cache_capacity_tokens
    reported_concurrency: float | None = None  # kvcap_kv_cache_max_concurrency
    derived_tokens: int | None = None  # kvcap_kv_cache_derived_capacity_tokens
    derived_concurrency: float | None = None  # /engines, where kvcap gives it
    mismatch: int | None = None  # kvcap_kv_cache_capacity_mismatch
    note: str = ""  # kvcap's derivation error, or what went wrong observing

    @property
    def exact(self) -> bool:
        """kvcap derived what vLLM logged and reports: tokens equal, concurrency too if known."""
        if not self.started or self.derived_tokens is None or self.mismatch != 0:
            return False
        if self.derived_tokens != self.logged_tokens or self.derived_tokens != self.info_tokens:
            return False
        if self.derived_concurrency is None or self.info_concurrency is None:
            return True
        return abs(self.derived_concurrency - self.info_concurrency) <= 1e-12 * max(
            1.0, self.info_concurrency
        )


def observe(release: str, config: LiveConfig, workdir: Path) -> Row:
    """Start `config` (a family's, or a varied one) on `release` with a kvcap sidecar
    beside it; what both show. The row's `model` is the config's name."""
    model = config.name
    model_dir = write_model(workdir, config.family, **config.overrides)
    server = VllmServer(
        vllm_python(release), model_dir, workdir, max_model_len=config.max_model_len
    )
    try:
        server.start()
    except AssertionError:
        server.stop()
        return Row(release, model, started=False, log_lines=(error_line(server.log()),))
    except BaseException:  # stopped while starting (SIGTERM, Ctrl-C): no server left behind
        server.stop()
        raise
    try:
        logged = server.logged_capacity()
        assert len(logged) == 1, f"expected one engine's capacity line, got {logged}"
        info = _cache_config_info(server.metrics())
        row = Row(
            release,
            model,
            started=True,
            log_lines=logged[0].lines,
            logged_tokens=logged[0].kv_cache_size_tokens,
            logged_concurrency=logged[0].max_concurrency,
            info_tokens=_int(info.get("kv_cache_size_tokens")),
            info_concurrency=_float(info.get("kv_cache_max_concurrency")),
            block_size=_int(info.get("block_size")),
        )
        with _sidecar(workdir, server, model_dir) as sidecar:
            return _with_kvcap(row, sidecar, server)
    finally:
        server.stop()


def observe_or_say_why(release: str, config: LiveConfig, workdir: Path) -> Row:
    """`observe`, with a failure to observe (not a refused start) kept as the row's note."""
    try:
        return observe(release, config, workdir)
    except AssertionError as error:
        why = str(error).splitlines()[0] if str(error) else type(error).__name__
        return Row(
            release, config.name, started=True, log_lines=("?",), note=f"not observed: {why}"
        )


def _sidecar(workdir: Path, server: VllmServer, model_dir: Path) -> Sidecar:
    return Sidecar(
        workdir,
        [
            "--no-collector.handshake",
            f"--vllm.url={server.url}",
            f"--vllm.poll-interval={POLL_INTERVAL_S}",
            f"--model.config={model_dir}",
        ],
    )


def _with_kvcap(row: Row, sidecar: Sidecar, server: VllmServer) -> Row:
    """`row` completed with what the sidecar exports for the one engine."""

    seen: list[tuple[Any, Any]] = []

    def settled() -> dict[str, Any] | None:
        # The steady state: the release learned (/version), and the same derivation on two
        # reads more than a poll apart (kvcap's first poll may plan before it knows them).
        try:
            engines = sidecar.engines()
        except AssertionError:  # one read timed out (5 s) on the busy cores: read again
            return None
        if len(engines) != 1 or not engines[0].get("vllm_version"):
            return None
        engine = engines[0]
        decision = (engine.get("derived_kv_cache_size_tokens"), engine.get("derivation_error"))
        if decision == (None, None):
            return None
        seen.append(decision)
        if len(seen) < 2 or seen[-2] != decision:
            time.sleep(2 * POLL_INTERVAL_S)
            return None
        return engine

    context = lambda: sidecar.tail() + "\n--- vLLM ---\n" + server.tail()  # noqa: E731
    try:
        engine = wait_for(settled, 60, "kvcap's derivation of the engine", context)
    except AssertionError as error:
        return _replace(row, note=str(error).splitlines()[0])
    scrape = sidecar.scrape()
    name = str(engine["engine"])
    values = {
        key: scrape.value(metric, engine=name)
        for key, metric in (
            ("reported_tokens", "kvcap_kv_cache_capacity_tokens"),
            ("reported_concurrency", "kvcap_kv_cache_max_concurrency"),
            ("derived_tokens", "kvcap_kv_cache_derived_capacity_tokens"),
            ("mismatch", "kvcap_kv_cache_capacity_mismatch"),
        )
    }
    return _replace(
        row,
        reported_tokens=_int(values["reported_tokens"]),
        reported_concurrency=values["reported_concurrency"],
        derived_tokens=_int(values["derived_tokens"]),
        derived_concurrency=_derived_concurrency(engine),
        mismatch=_int(values["mismatch"]),
        note=str(engine.get("derivation_error") or ""),
    )


def _derived_concurrency(engine: dict[str, Any]) -> float | None:
    """kvcap's own max concurrency from /engines, under whichever key this version uses."""
    for key in ("derived_kv_cache_max_concurrency", "derived_max_concurrency"):
        if isinstance(engine.get(key), int | float):
            return float(engine[key])
    derived = engine.get("derived")
    if isinstance(derived, dict) and isinstance(derived.get("kv_cache_max_concurrency"), float):
        return float(derived["kv_cache_max_concurrency"])
    return None


def dump_row(row: Row, path: Path) -> None:
    """Append `row` to a JSON-lines file (full precision; `exact` for readers of the file)."""
    with path.open("a") as out:
        out.write(json.dumps({**asdict(row), "exact": row.exact}) + "\n")


def load_rows(path: Path) -> list[Row]:
    rows = []
    for line in path.read_text().splitlines():
        record = json.loads(line)
        record.pop("exact", None)
        record["log_lines"] = tuple(record["log_lines"])
        rows.append(Row(**record))
    return rows


def _cache_config_info(metrics: str) -> dict[str, str]:
    samples = parse(metrics).get("vllm:cache_config_info", [])
    assert len(samples) == 1, f"expected one cache_config_info sample, got {samples}"
    return samples[0][0]


def _replace(row: Row, **changes: Any) -> Row:
    return Row(**{**asdict(row), **changes})


def _int(value: str | float | None) -> int | None:
    return None if value is None else int(float(value))


def _float(value: str | None) -> float | None:
    return None if value is None else float(value)


# The table --------------------------------------------------------------------------------

COLUMNS = (
    "release",
    "model",
    "vLLM log",
    "cache_config_info tokens / concurrency",
    "kvcap reported",
    "kvcap derived",
    "mismatch",
    "exact",
)


def cells(row: Row) -> list[str]:
    if not row.started:
        return [row.release, row.model, f"refused: {row.log_lines[0]}", "-", "-", "-", "-", "-"]
    derived = _figures(row.derived_tokens, row.derived_concurrency)
    if row.note:
        derived = f"{derived} ({row.note})"
    return [
        row.release,
        row.model,
        " / ".join(row.log_lines),
        _figures(row.info_tokens, row.info_concurrency),
        _figures(row.reported_tokens, row.reported_concurrency),
        derived,
        "-" if row.mismatch is None else str(row.mismatch),
        "yes" if row.exact else "no",
    ]


def _figures(tokens: int | None, concurrency: float | None) -> str:
    shown = "?" if tokens is None else f"{tokens:,}"
    return shown if concurrency is None else f"{shown} / {concurrency:.6g}x"


def markdown(rows: Iterable[Row]) -> str:
    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    body = [line(COLUMNS), line(["---"] * len(COLUMNS))]
    return "\n".join(body + [line(cells(row)) for row in rows])


def text_table(rows: Iterable[Row]) -> str:
    table = [list(COLUMNS)] + [cells(row) for row in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--release", action="append", choices=MATRIX_RELEASES, help="repeatable (default: all)"
    )
    parser.add_argument(
        "--configs",
        choices=tuple(CONFIG_SETS),
        default="families",
        help="which configs: the tiny families, the varied ones (tools/live/varied.py), all",
    )
    parser.add_argument("--family", action="append", choices=tuple(TINY_MODELS), help="repeatable")
    parser.add_argument(
        "--config",
        action="append",
        choices=tuple(CONFIG_SETS["all"]),
        help="one config by name, e.g. qwen3_next.head_dim=32 (repeatable)",
    )
    parser.add_argument("--markdown", action="store_true", help="a markdown table, for notes")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON lines here")
    parser.add_argument("--from-json", type=Path, help="print the table of rows written before")
    options = parser.parse_args(argv)
    if options.from_json:
        print_table(load_rows(options.from_json), options.markdown, elapsed_s=None)
        return 0
    # SIGTERM (a run stopped half way) unwinds like Ctrl-C: the running server is stopped.
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    releases = options.release or list(MATRIX_RELEASES)
    configs = chosen_configs(options.configs, options.family, options.config)
    started = time.monotonic()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="kvcap-live-matrix-") as tmp:
        for release in releases:
            for number, config in enumerate(configs):
                workdir = Path(tmp) / f"{release}-{number}"
                workdir.mkdir()
                row = observe_or_say_why(release, config, workdir)
                print(" ".join(cells(row)), file=sys.stderr, flush=True)
                rows.append(row)
                if options.json:
                    dump_row(row, options.json)
    print_table(rows, options.markdown, elapsed_s=time.monotonic() - started)
    return 0


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def chosen_configs(
    config_set: str, families: Sequence[str] | None, names: Sequence[str] | None
) -> list[LiveConfig]:
    """The configs of one run: those named (--family, --config), else the whole set."""
    every = CONFIG_SETS["all"]
    if families or names:
        return [every[name] for name in [*(families or ()), *(names or ())]]
    return list(CONFIG_SETS[config_set].values())


def print_table(rows: Sequence[Row], as_markdown: bool, elapsed_s: float | None) -> None:
    print(markdown(rows) if as_markdown else text_table(rows))
    exact = sum(row.exact for row in rows)
    took = "" if elapsed_s is None else f" in {elapsed_s:.0f} s"
    print(f"\n{exact}/{len(rows)} exact; {len(rows)} engines{took}")


if __name__ == "__main__":
    sys.exit(main())
