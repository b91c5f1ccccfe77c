"""kvcap's alerts and recording rules: promtool's check and unit tests, the unit tests'
coverage (every alert fires and does not fire, every recording rule has a value checked),
that a broken rule fails them, and the rules on a real Prometheus scraping the exporter
that watches the simulated vLLM deployment."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from exporter.demo import DEMO_SERVED_NAME, demo_running
from exporter.demo.simulated_vllm import SimulatedVllm
from tests.integration.prometheus import Prometheus
from tests.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
RULES_PATH = ROOT / "helm" / "kvcap-exporter" / "files" / "kvcap-rules.yaml"
UNIT_TESTS_PATH = ROOT / "deploy" / "prometheus" / "kvcap-rules.test.yaml"
DOC = ROOT / "docs" / "alerts-and-dashboards.md"
METRICS_DOC = ROOT / "docs" / "metrics.md"

RULES: dict[str, Any] = yaml.safe_load(RULES_PATH.read_text(encoding="utf-8"))
UNIT_TESTS: dict[str, Any] = yaml.safe_load(UNIT_TESTS_PATH.read_text(encoding="utf-8"))
ALL_RULES = [rule for group in RULES["groups"] for rule in group["rules"]]
ALERTS = {rule["alert"]: rule for rule in ALL_RULES if "alert" in rule}
RECORDS = {rule["record"]: rule for rule in ALL_RULES if "record" in rule}

EXPECTED_ALERTS = {
    "KvcapEngineCannotHoldOneRequest",
    "KvcapCapacityMismatch",
    "KvcapCapacityUnknown",
    "KvcapEngineStale",
    "KvcapEngineNotUpdating",
    "KvcapCollectorDown",
    "KvcapGpuMemoryNearlyFull",
    "KvcapExporterDown",
}
EXPECTED_RECORDS = {
    "namespace_model_name:kvcap_kv_cache_capacity_tokens:sum",
    "namespace_model_name:kvcap_kv_cache_used_tokens:sum",
    "namespace_model_name:kvcap_kv_cache_max_concurrency:sum",
    "namespace_model_name:kvcap_kv_cache_utilisation:ratio",
    "namespace_model_name:kvcap_kv_cache_headroom_tokens:sum",
    "namespace_model_name:kvcap_engines:count",
}


def promtool(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
        check=False,
    )


# --- promtool ---------------------------------------------------------------------------


def test_promtool_check_rules() -> None:
    run = promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES_PATH))
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(ALL_RULES)} rules found" in run.stdout


def test_promtool_unit_tests() -> None:
    run = promtool("test", "rules", str(UNIT_TESTS_PATH))
    assert run.returncode == 0, run.stdout + run.stderr
    assert "SUCCESS" in run.stdout


def _replace(old: str, new: str) -> Callable[[str], str]:
    def change(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)

    return change


# A broken rule must fail the unit tests: they pin thresholds, `for:` and the totals.
BROKEN = {
    "gpu threshold raised": _replace("> 0.97", "> 0.99"),
    "concurrency threshold off by one": _replace("max_concurrency < 1", "max_concurrency <= 1"),
    "capacity branch dropped": _replace(
        "\n          or\n          kvcap_kv_cache_capacity_tokens / kvcap_max_model_len_tokens < 1",
        "",
    ),
    "mismatch waits less": _replace("for: 15m", "for: 10m"),
    "totals count double scrapes twice": _replace(
        "max by (namespace, pod, instance, engine, model_name) (kvcap_kv_cache_capacity_tokens)",
        "sum by (namespace, pod, instance, engine, model_name, job) "
        "(kvcap_kv_cache_capacity_tokens)",
    ),
    "utilisation over all engines": _replace(
        "kvcap_kv_cache_capacity_tokens and kvcap_kv_cache_used_tokens",
        "kvcap_kv_cache_capacity_tokens",
    ),
    "handshake-only engines not left out": _replace(
        'kvcap_engine_info{collectors=~"(.*,)?vllm_http(,.*)?"}', "kvcap_engine_info"
    ),
    "stale engines not left out": _replace(
        "\n          unless on (job, instance, engine, model_name)\n"
        "            kvcap_engine_stale == 1",
        "",
    ),
    "reported capacity not left out": _replace(
        "\n          unless kvcap_kv_cache_capacity_tokens", ""
    ),
    "any job's targets": _replace('up{job=~".*kvcap.*"}', "up"),
    "description template changed": _replace("holds only", "has only"),
}


@pytest.mark.parametrize("change", BROKEN.values(), ids=list(BROKEN))
def test_a_broken_rule_fails_the_unit_tests(tmp_path: Path, change: Callable[[str], str]) -> None:
    (tmp_path / "kvcap-rules.yaml").write_text(
        change(RULES_PATH.read_text(encoding="utf-8")), encoding="utf-8"
    )
    assert promtool("check", "rules", str(tmp_path / "kvcap-rules.yaml")).returncode == 0
    tests = dict(UNIT_TESTS, rule_files=["kvcap-rules.yaml"])
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests), encoding="utf-8")
    run = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert run.returncode != 0, run.stdout
    assert "FAILED" in run.stdout + run.stderr


# --- the rules' shape and the unit tests' coverage --------------------------------------


def test_rules_file_is_a_plain_prometheus_rules_file() -> None:
    assert set(RULES) == {"groups"}
    assert [g["name"] for g in RULES["groups"]] == ["kvcap.rules", "kvcap.alerts"]
    assert set(ALERTS) == EXPECTED_ALERTS
    assert set(RECORDS) == EXPECTED_RECORDS


def _minutes(duration: str) -> int:
    found = re.fullmatch(r"(\d+)([mh])", duration)
    assert found, duration
    return int(found[1]) * (60 if found[2] == "h" else 1)


@pytest.mark.parametrize("name", sorted(EXPECTED_ALERTS))
def test_alert_has_severity_for_and_templated_annotations(name: str) -> None:
    rule = ALERTS[name]
    assert rule["labels"]["severity"] in {"critical", "warning"}
    assert 5 <= _minutes(rule["for"]) <= 30
    assert set(rule["annotations"]) == {"summary", "description"}
    for text in rule["annotations"].values():
        assert "$labels." in text
    assert "$labels.pod" in rule["annotations"]["description"]


def test_recording_rule_names_follow_level_metric_operations() -> None:
    for name, rule in RECORDS.items():
        level, metric, operation = name.split(":")
        assert metric.startswith("kvcap_")
        assert operation in {"sum", "count", "ratio"}
        # The level names the labels the rule keeps.
        assert f"by ({level.replace('_model_name', ', model_name')})" in rule["expr"], name


def test_every_alert_fires_and_does_not_fire_in_the_unit_tests() -> None:
    fires: set[str] = set()
    quiet: set[str] = set()
    for test in UNIT_TESTS["tests"]:
        for case in test.get("alert_rule_test", []):
            (fires if case["exp_alerts"] else quiet).add(case["alertname"])
            for alert in case["exp_alerts"]:
                assert (
                    alert["exp_labels"]["severity"]
                    == (ALERTS[case["alertname"]]["labels"]["severity"])
                )
    assert fires == EXPECTED_ALERTS
    assert quiet == EXPECTED_ALERTS


def test_every_recording_rule_value_is_checked_in_the_unit_tests() -> None:
    checked = {
        case["expr"]
        for test in UNIT_TESTS["tests"]
        for case in test.get("promql_expr_test", [])
        if case["exp_samples"]
    }
    assert checked == EXPECTED_RECORDS


def test_rules_use_only_documented_metrics() -> None:
    documented = set(re.findall(r"`(kvcap_\w+)`", METRICS_DOC.read_text(encoding="utf-8")))
    used = {
        metric for rule in ALL_RULES for metric in re.findall(r"(?<![:\w])kvcap_\w+", rule["expr"])
    }
    assert used
    assert used - documented == set()


def test_every_alert_and_recording_rule_is_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    for name in EXPECTED_ALERTS:
        assert f"### {name}" in text, name
    for name in EXPECTED_RECORDS:
        assert f"`{name}`" in text, name


# --- on a real Prometheus scraping the exporter ----------------------------------------

NAMESPACE = "demo"
POD = "vllm-0"


class RulesPrometheus(Prometheus):
    """The integration helper's Prometheus, evaluating kvcap's rules every second, with
    the labels a PodMonitor would give the sidecar's series."""

    def __init__(self, workdir: Path, target: str) -> None:
        super().__init__(workdir, [target])
        config = {
            "global": {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            },
            "rule_files": [str(RULES_PATH)],
            "scrape_configs": [
                {
                    "job_name": "demo/kvcap-exporter",
                    "static_configs": [
                        {"targets": [target], "labels": {"namespace": NAMESPACE, "pod": POD}}
                    ],
                }
            ],
        }
        self.config.write_text(yaml.safe_dump(config), encoding="utf-8")

    def value(self, promql: str) -> dict[str, float]:
        """engine (or the whole label set) -> value."""
        return {
            s["metric"].get("engine", str(s["metric"])): float(s["value"][1])
            for s in self.query(promql)
        }


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[SimulatedVllm, RulesPrometheus]]:
    with demo_running(tmp_path / "models", poll_interval_s=0.2) as (simulation, exporter):
        server = RulesPrometheus(tmp_path, exporter.server.url.removeprefix("http://"))
        with server:
            yield simulation, server


def test_rules_on_a_real_prometheus(live: tuple[SimulatedVllm, RulesPrometheus]) -> None:
    simulation, prometheus = live
    plan = simulation.plan
    totals = f'{{namespace="{NAMESPACE}", model_name="{DEMO_SERVED_NAME}"}}'
    prometheus.wait_until(
        lambda: prometheus.value(f"namespace_model_name:kvcap_engines:count{totals}"),
        "the recording rules",
    )
    capacity = prometheus.value(f"namespace_model_name:kvcap_kv_cache_capacity_tokens:sum{totals}")
    assert list(capacity.values()) == [2 * plan.kv_cache_size_tokens]
    concurrency = prometheus.value(
        f"namespace_model_name:kvcap_kv_cache_max_concurrency:sum{totals}"
    )
    assert list(concurrency.values()) == [pytest.approx(2 * plan.max_concurrency)]
    assert list(prometheus.value(f"namespace_model_name:kvcap_engines:count{totals}").values()) == [
        2
    ]
    prometheus.wait_until(
        lambda: prometheus.value(f"namespace_model_name:kvcap_kv_cache_utilisation:ratio{totals}"),
        "utilisation",
    )
    (ratio,) = prometheus.value(
        f"namespace_model_name:kvcap_kv_cache_utilisation:ratio{totals}"
    ).values()
    assert 0 < ratio < 1

    # A healthy deployment: no kvcap alert is even pending.
    assert prometheus.query('ALERTS{alertname=~"Kvcap.*"}') == []

    # vLLM goes away: the source is down and both engines go stale (pending: `for:`).
    vllm_url = simulation.url
    simulation.stop()
    prometheus.wait_until(
        lambda: (
            prometheus.value('ALERTS{alertname="KvcapEngineStale", alertstate="pending"}').keys()
            == {"0", "1"}
        ),
        "KvcapEngineStale pending for both engines",
    )
    (down,) = prometheus.query('ALERTS{alertname="KvcapCollectorDown"}')
    assert down["metric"] | {"target": ""} == {
        "__name__": "ALERTS",
        "alertname": "KvcapCollectorDown",
        "alertstate": "pending",
        "severity": "warning",
        "job": "demo/kvcap-exporter",
        "instance": prometheus.query("up")[0]["metric"]["instance"],
        "namespace": NAMESPACE,
        "pod": POD,
        "collector": "vllm_http",
        "target": "",
    }
    assert down["metric"]["target"] == vllm_url
