"""The Grafana dashboard: its shape, a type check against Grafana's own schema types
(@grafana/schema with tsc), and every panel query answered by a real Prometheus that
scrapes the exporter watching the simulated vLLM deployment."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.demo import DEMO_SERVED_NAME, demo_running
from exporter.state import GpuProcessMemory, GpuReport
from tests.integration.prometheus import Prometheus
from tests.support.http_server import http_serving
from tests.tools import missing

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD_PATH = ROOT / "helm" / "kvcap-exporter" / "files" / "kvcap-dashboard.json"
GRAFANA_DIR = ROOT / "deploy" / "grafana"
TSC = ROOT / ".tools" / "node_modules" / ".bin" / "tsc"
METRICS_DOC = ROOT / "docs" / "metrics.md"

DASHBOARD: dict[str, Any] = json.loads(DASHBOARD_PATH.read_text(encoding="utf-8"))
VARIABLES = ["datasource", "cluster", "namespace", "model_name", "engine", "pod"]
ROWS = [
    "Capacity",
    "Totals per model (all data-parallel engines)",
    "Live use",
    "KV cache groups (hybrid models)",
    "GPU memory and headroom",
    "Offload tier",
    "Exporter health",
    "Prefix cache (KV events)",
]
# The labels a PodMonitor gives the sidecar's series; the test Prometheus sets them as
# static labels of its scrape target.
NAMESPACE = "demo"
POD = "vllm-0"
CLUSTER = "test"
EXTRA_VLLM_SERIES = ROOT / "tests" / "fixtures" / "vllm-0.32-extra-series.txt"


@dataclass(frozen=True)
class Query:
    panel: str
    ref_id: str
    expr: str

    @property
    def id(self) -> str:
        return f"{self.panel}/{self.ref_id}"


def panels() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for panel in DASHBOARD["panels"]:
        found.append(panel)
        found.extend(panel.get("panels", []))
    return found


def queries() -> list[Query]:
    return [
        Query(panel["title"], target["refId"], target["expr"])
        for panel in panels()
        if panel["type"] != "row"
        for target in panel["targets"]
    ]


def variable(name: str) -> dict[str, Any]:
    return next(v for v in DASHBOARD["templating"]["list"] if v["name"] == name)


# --- shape ------------------------------------------------------------------------------


def test_dashboard_identity() -> None:
    assert DASHBOARD["title"] == "kvcap: vLLM KV cache capacity"
    assert DASHBOARD["uid"] == "kvcap-kv-cache"
    assert len(DASHBOARD["uid"]) <= 40  # Grafana's limit
    assert DASHBOARD["schemaVersion"] >= 39
    assert DASHBOARD["id"] is None  # instance-specific; a provisioned dashboard has none
    assert "kvcap" in DASHBOARD["tags"]


def test_variables() -> None:
    assert [v["name"] for v in DASHBOARD["templating"]["list"]] == VARIABLES
    assert variable("datasource")["type"] == "datasource"
    assert variable("datasource")["query"] == "prometheus"
    for name in VARIABLES[1:]:
        var = variable(name)
        assert var["type"] == "query"
        assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert var["includeAll"]
        assert var["multi"]
        assert var["allValue"] == ".*"
        assert var["query"].startswith("label_values(")


def test_rows() -> None:
    assert [p["title"] for p in DASHBOARD["panels"] if p["type"] == "row"] == ROWS


def test_panel_ids_are_unique_and_the_grid_has_no_overlaps() -> None:
    ids = [p["id"] for p in panels()]
    assert len(ids) == len(set(ids))
    taken: set[tuple[int, int]] = set()
    for panel in panels():
        pos = panel["gridPos"]
        assert pos["x"] >= 0, panel["title"]
        assert pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & taken, f"{panel['title']} overlaps another panel"
        taken |= cells


def test_every_panel_queries_prometheus_through_the_datasource_variable() -> None:
    for panel in panels():
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert panel.get("description"), panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]


@pytest.mark.parametrize("query", queries(), ids=lambda q: q.id)
def test_every_query_follows_the_cluster_namespace_and_pod_variables(query: Query) -> None:
    for selector in re.findall(r"(?:kvcap_|vllm:)\w+\{([^}]*)\}", query.expr):
        assert 'cluster=~"$cluster", namespace=~"$namespace"' in selector, query.expr
        assert 'pod=~"$pod"' in selector, query.expr
    assert not re.search(r"(?:kvcap_|vllm:)\w+(?![\w{])", query.expr), (
        f"unfiltered metric: {query.expr}"
    )


@pytest.mark.parametrize("query", queries(), ids=lambda q: q.id)
def test_a_query_of_engines_follows_the_model_name_variable(query: Query) -> None:
    """Picking a model narrows every per-engine panel (the prefix lifetimes did not): by a
    selector of the series, or a join with kvcap_engine_info selected by model."""
    if 'engine=~"$engine"' in query.expr:
        assert 'model_name=~"$model_name"' in query.expr, query.expr


# Labels Prometheus adds to every target (PodMonitor, ServiceMonitor, static configs).
TARGET_LABELS = {"cluster", "namespace", "pod", "container", "job", "instance", "endpoint"}


def documented_labels(metric: str) -> set[str]:
    """The labels docs/metrics.md gives a self metric in its table row."""
    for line in METRICS_DOC.read_text(encoding="utf-8").splitlines():
        cells = line.split("|")
        if len(cells) > 4 and cells[1].strip() == f"`{metric}`":
            return set(re.findall(r"`(\w+)`", cells[3]))
    raise AssertionError(f"{metric} is not in docs/metrics.md")


@pytest.mark.parametrize("query", queries(), ids=lambda q: q.id)
def test_collector_panels_group_by_labels_the_collector_series_have(query: Query) -> None:
    """A `by`/`on` label the series lack makes one group of everything (the collector
    panel's `source`, renamed `collector`, hid each collector's zero line)."""
    metrics = set(re.findall(r"kvcap_collector_(?:up|errors_total)\b", query.expr))
    if not metrics:
        return
    allowed = TARGET_LABELS | {label for m in metrics for label in documented_labels(m)}
    for labels in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", query.expr):
        assert {x.strip() for x in labels.split(",")} <= allowed, query.expr


def test_queries_use_only_documented_metrics() -> None:
    documented = set(re.findall(r"`(kvcap_\w+)`", METRICS_DOC.read_text(encoding="utf-8")))
    used = set()
    for text in [q.expr for q in queries()] + [variable(name)["query"] for name in VARIABLES[1:]]:
        used |= set(re.findall(r"kvcap_\w+", text))
    assert used - documented == set()
    # The panels the issue asks for are there.
    for metric in (
        "kvcap_kv_cache_capacity_tokens",
        "kvcap_kv_cache_max_concurrency",
        "kvcap_kv_cache_blocks",
        "kvcap_kv_cache_used_tokens",
        "kvcap_kv_cache_group_info",
        "kvcap_kv_cache_group_layers",
        "kvcap_kv_cache_group_blocks_per_request",
        "kvcap_kv_cache_group_page_bytes",
        "kvcap_kv_cache_bytes",
        "kvcap_gpu_memory_used_bytes",
        "kvcap_gpu_memory_free_bytes",
        "kvcap_kv_cache_headroom_tokens",
        "kvcap_collector_up",
        "kvcap_collector_errors_total",
        "kvcap_collector_read_duration_seconds",
        "kvcap_build_info",
    ):
        assert metric in used, metric


def test_dashboard_fits_a_configmap_applied_client_side() -> None:
    # `kubectl apply` copies the object into an annotation limited to 256 KiB.
    assert DASHBOARD_PATH.stat().st_size < 200_000


# --- type check against @grafana/schema -----------------------------------------------


def require_tsc() -> list[str]:
    node = shutil.which("node")
    if node is None or not TSC.exists():
        missing(f"node or {TSC} is missing (`make tools` installs it)")
    return [node, str(TSC)]


def tsc(project: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*require_tsc(), "--noEmit", "--pretty", "false", "-p", str(project)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )


def typescript_project(directory: Path, files: dict[str, str]) -> Path:
    """A tsc project in `directory` that extends deploy/grafana's (same compiler options
    and @grafana/schema resolution) and checks `files`."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text, encoding="utf-8")
    config = {"extends": str(GRAFANA_DIR / "tsconfig.json"), "files": sorted(files)}
    (directory / "tsconfig.json").write_text(json.dumps(config), encoding="utf-8")
    return directory


def json_types_import(directory: Path) -> str:
    return Path(os.path.relpath(GRAFANA_DIR / "json-types", directory)).as_posix()


def as_import(directory: Path, json_name: str) -> str:
    """A module that imports a dashboard JSON file, as deploy/grafana/dashboard.ts does."""
    return (
        'import type { Dashboard } from "@grafana/schema";\n'
        f'import type {{ Json }} from "{json_types_import(directory)}";\n'
        f'import dashboard from "./{json_name}";\n'
        "export const checked: Json<Dashboard> = dashboard;\n"
    )


def as_literal(directory: Path, dashboard: dict[str, Any]) -> str:
    """A module with the dashboard as an object literal: string values are checked
    against Grafana's enums and unions, and unknown properties are errors."""
    return (
        'import type { Dashboard } from "@grafana/schema";\n'
        f'import type {{ Literal }} from "{json_types_import(directory)}";\n'
        f"export const checked = {json.dumps(dashboard, indent=2)} satisfies Literal<Dashboard>;\n"
    )


def test_dashboard_typechecks_against_grafana_schema() -> None:
    run = tsc(GRAFANA_DIR)
    assert run.returncode == 0, run.stdout + run.stderr


def test_dashboard_as_object_literal_typechecks(tmp_path: Path) -> None:
    project = typescript_project(tmp_path, {"literal.ts": as_literal(tmp_path, DASHBOARD)})
    run = tsc(project)
    assert run.returncode == 0, run.stdout + run.stderr


def _mutated(change: Any) -> dict[str, Any]:
    copy: dict[str, Any] = json.loads(json.dumps(DASHBOARD))
    change(copy)
    return copy


def _first_panel(dashboard: dict[str, Any]) -> dict[str, Any]:
    panel: dict[str, Any] = next(p for p in dashboard["panels"] if p["type"] != "row")
    return panel


def _set(path: str, value: Any) -> Any:
    def change(dashboard: dict[str, Any]) -> None:
        *parents, key = path.split(".")
        node: Any = dashboard
        for part in parents:
            node = _first_panel(node) if part == "PANEL" else node[part]
        node[key] = value

    return change


def _drop_variable_name(dashboard: dict[str, Any]) -> None:
    del dashboard["templating"]["list"][1]["name"]


def _misspell_variable_type(dashboard: dict[str, Any]) -> None:
    dashboard["templating"]["list"][1]["type"] = "querry"


def _misspell_thresholds_mode(dashboard: dict[str, Any]) -> None:
    _first_panel(dashboard)["fieldConfig"]["defaults"]["thresholds"]["mode"] = "absolut"


# (file, how the copy is checked, the change, what tsc must say about it)
WRONG = [
    ("schema_version_string", "import", _set("schemaVersion", "39"), "TS2322"),
    ("grid_height_string", "import", _set("PANEL.gridPos.h", "5"), "TS2322"),
    ("editable_number", "import", _set("editable", 1), "TS2322"),
    ("variable_without_name", "import", _drop_variable_name, "TS2322"),
    ("variable_type_misspelt", "literal", _misspell_variable_type, "TS2820"),
    ("thresholds_mode_misspelt", "literal", _misspell_thresholds_mode, "TS2820"),
    ("unknown_panel_field", "literal", _set("PANEL.gridPoz", {}), "TS2353"),
]


def test_wrong_typed_copies_fail_the_type_check(tmp_path: Path) -> None:
    files: dict[str, str] = {}
    for name, kind, change, _ in WRONG:
        copy = _mutated(change)
        if kind == "import":
            (tmp_path / f"{name}.json").write_text(json.dumps(copy, indent=2), encoding="utf-8")
            files[f"{name}.ts"] = as_import(tmp_path, f"{name}.json")
        else:
            files[f"{name}.ts"] = as_literal(tmp_path, copy)
    run = tsc(typescript_project(tmp_path, files))
    assert run.returncode != 0
    errors: dict[str, set[str]] = {}
    for line in run.stdout.splitlines():
        found = re.match(r"(?:.*/)?(\w+)\.ts\(\d+,\d+\): error (TS\d+)", line)
        if found:
            errors.setdefault(found[1], set()).add(found[2])
    for name, _, _, code in WRONG:
        assert code in errors.get(name, set()), f"{name}: {errors.get(name)}\n{run.stdout}"


# --- every query answers from a real Prometheus scraping the demo ---------------------

H100_BYTES = 85_520_809_984  # NVML's total for an H100 80GB HBM3


def demo_gpus() -> list[GpuReport]:
    """The demo's four GPUs (data-parallel 2 x TP 2) as NVML would report them: vLLM's
    default --gpu-memory-utilization 0.9 leaves about 92% in use."""
    used = int(H100_BYTES * 0.92)
    return [
        GpuReport(
            index=str(i),
            uuid=f"GPU-{i:08x}-0000-0000-0000-000000000000",
            name="NVIDIA H100 80GB HBM3",
            pci_bus_id=f"00000000:{0x18 + i:02X}:00.0",
            driver_version="550.54.15",
            memory_total_bytes=H100_BYTES,
            memory_used_bytes=used,
            memory_free_bytes=H100_BYTES - used,
            memory_reserved_bytes=500_000_000,
            processes=(GpuProcessMemory(pid=4000 + i, used_bytes=used - 600_000_000),),
        )
        for i in range(4)
    ]


class DemoPrometheus(Prometheus):
    """The integration helper's Prometheus, with the labels a PodMonitor would add to the
    sidecar's series and to vLLM's (the simulated vLLM's /metrics, job vllm, and vLLM
    series it lacks: tests/fixtures/vllm-0.32-extra-series.txt), and a cluster label."""

    def __init__(self, workdir: Path, kvcap: str, vllm: list[str]) -> None:
        super().__init__(workdir, [kvcap])
        labels = {"namespace": NAMESPACE, "pod": POD, "cluster": CLUSTER}
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s"},
            "scrape_configs": [
                {
                    "job_name": "demo/kvcap-exporter",
                    "static_configs": [{"targets": [kvcap], "labels": labels}],
                },
                {"job_name": "vllm", "static_configs": [{"targets": vllm, "labels": labels}]},
            ],
        }
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")

    def answer(self, promql: str) -> list[dict[str, Any]]:
        """The query's result; a query Prometheus rejects fails the test with its error."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": promql}
        )
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as error:
            pytest.fail(f"Prometheus rejected {promql!r}: {error.read().decode()}")
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoPrometheus]:
    workdir = tmp_path_factory.mktemp("dashboard")
    with (
        demo_running(workdir / "models", poll_interval_s=0.2) as (simulation, exporter),
        serving(EXTRA_VLLM_SERIES) as extra,
    ):
        # No GPUs here: publish what the NVML source would, as that source does.
        exporter.store.publish_gpus("nvml", "local", demo_gpus())
        vllm = [urllib.parse.urlsplit(url).netloc for url in (simulation.url, extra)]
        server = DemoPrometheus(workdir, exporter.server.url.removeprefix("http://"), vllm)
        with server:
            for promql, count in [
                ("kvcap_kv_cache_capacity_tokens", 2),
                ("kvcap_kv_cache_used_tokens", 2),
                ("kvcap_gpu_memory_used_bytes", 4),
                ('kvcap_kv_cache_bytes{uuid!=""}', 4),
                ("kvcap_kv_cache_headroom_tokens", 2),
                ("vllm:kv_cache_usage_perc", 2),
                ("vllm:num_preemptions_total", 2),
                # Every KV cache group of both engines (Gemma 3 27B: six sliding-window
                # groups and one full-attention group each), as the demo's plan has them.
                ("kvcap_prefix_cache_resident_blocks", 2 * len(simulation.plan.capacity.groups)),
            ]:
                server.wait_until(
                    lambda q=promql, n=count: len(server.query(q)) == n, f"{promql} x {count}"
                )
            # rate() and the like need a few samples in their window.
            server.wait_until(
                lambda: any(
                    float(s["value"][1]) >= 4
                    for s in server.query("count_over_time(kvcap_build_info[1m])")
                ),
                "four scrapes",
            )
            yield server


@contextlib.contextmanager
def serving(path: Path) -> Iterator[str]:
    """`path` as a Prometheus exposition on a loopback HTTP server; yields its URL."""
    body = path.read_bytes()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with http_serving(Handler) as url:
        yield url


def grafana_regex_escape(value: str) -> str:
    """How Grafana's Prometheus data source escapes a selected value inside =~"...": a
    regex escape whose backslash is itself escaped for the PromQL string."""
    return re.sub(r"[$^*{}\[\]'+?.()|\\]", lambda m: "\\\\" + m[0], value)


SELECTIONS = {
    # Every variable on "All" (allValue .*).
    "all": {"cluster": ".*", "namespace": ".*", "pod": ".*", "model_name": ".*", "engine": ".*"},
    # One of each, as Grafana writes a single value of a multi-value variable.
    "one": {
        "cluster": grafana_regex_escape(CLUSTER),
        "namespace": grafana_regex_escape(NAMESPACE),
        "pod": grafana_regex_escape(POD),
        "model_name": grafana_regex_escape(DEMO_SERVED_NAME),
        "engine": "0",
    },
}
BUILT_IN = {"__rate_interval": "1m", "__interval": "1s", "__range": "1h", "datasource": "x"}


def substitute(expr: str, values: dict[str, str]) -> str:
    known = values | BUILT_IN

    def replace(match: re.Match[str]) -> str:
        name = match[1] or match[2]
        assert name in known, f"unknown variable ${name} in {expr}"
        return known[name]

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)", replace, expr)


def test_substitute() -> None:
    assert (
        substitute('rate(x{pod=~"$pod"}[$__rate_interval])', {"pod": "a"})
        == 'rate(x{pod=~"a"}[1m])'
    )
    assert grafana_regex_escape("google/gemma-3.1") == "google/gemma-3\\\\.1"
    with pytest.raises(AssertionError, match="unknown variable"):
        substitute("x{a=~'$nope'}", {})


@pytest.mark.parametrize("selection", sorted(SELECTIONS))
@pytest.mark.parametrize("query", queries(), ids=lambda q: q.id)
def test_every_panel_query_returns_data(
    prometheus: DemoPrometheus, query: Query, selection: str
) -> None:
    promql = substitute(query.expr, SELECTIONS[selection])
    result = prometheus.answer(promql)
    assert result, f"no data for panel {query.panel!r} {query.ref_id}: {promql}"


EXPECTED_VARIABLE_VALUES = {
    "cluster": {CLUSTER},
    "namespace": {NAMESPACE},
    "pod": {POD},
    "model_name": {DEMO_SERVED_NAME},
    "engine": {"0", "1"},
}


@pytest.mark.parametrize("name", VARIABLES[1:])
def test_variable_queries_find_the_demo(prometheus: DemoPrometheus, name: str) -> None:
    found = re.fullmatch(r"label_values\((.+), (\w+)\)", variable(name)["query"])
    assert found, variable(name)["query"]
    selector = substitute(found[1], SELECTIONS["all"])
    values = {series["metric"].get(found[2], "") for series in prometheus.answer(selector)}
    assert values == EXPECTED_VARIABLE_VALUES[name]


def test_gpu_split_adds_up(prometheus: DemoPrometheus) -> None:
    """KV cache + other = NVML used, per GPU, as the GPU memory table shows it."""
    panel = next(p for p in panels() if p["title"] == "GPU memory per GPU")
    exprs = {t["refId"]: substitute(t["expr"], SELECTIONS["all"]) for t in panel["targets"]}

    def by_gpu(promql: str) -> dict[str, float]:
        return {s["metric"]["gpu"]: float(s["value"][1]) for s in prometheus.answer(promql)}

    used = int(H100_BYTES * 0.92)
    deadline = time.monotonic() + 10
    while True:
        kv, other = by_gpu(exprs["B"]), by_gpu(exprs["C"])
        if set(kv) == set(other) == {"0", "1", "2", "3"} or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert {gpu: kv[gpu] + other[gpu] for gpu in kv} == dict.fromkeys(kv, used)
    assert all(value > 0 for value in kv.values())
