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
from exporter.demo.simulated_vllm import SimulatedVllm, offload_tier
from tests.deploy.conftest import K8sTools, one
from tests.integration.prometheus import Prometheus
from tests.tools import require_tool

ROOT = Path(__file__).resolve().parents[2]
# The chart's rules rendered with its default values (deploy/monitoring/sync.sh writes it).
RULES_PATH = ROOT / "deploy" / "prometheus" / "kvcap-rules.yaml"
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
    "KvcapKvCacheSaturated",
    "KvcapRequestsWaitingWithoutHeadroom",
    "KvcapCapacityDroppedAfterRestart",
    "KvcapEnginePreempting",
    "KvcapPrefixCacheEvictedFast",
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
    "namespace_model_name:kvcap_kv_total_capacity_tokens:sum",
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
    """Replaces the first `old` (any run of whitespace in it matches any other: the
    rendered file wraps long lines) with `new`."""
    pattern = re.compile(r"\s+".join(re.escape(word) for word in old.split()))

    def change(text: str) -> str:
        assert pattern.search(text), old
        return pattern.sub(new.replace("\\", "\\\\"), text, count=1)

    return change


# A broken rule must fail the unit tests: they pin thresholds, `for:` and the totals.
BROKEN = {
    "gpu threshold raised": _replace("> 0.97", "> 0.99"),
    "concurrency threshold off by one": _replace("max_concurrency < 1", "max_concurrency <= 1"),
    "capacity branch dropped": _replace(
        "or kvcap_kv_cache_capacity_tokens / kvcap_max_model_len_tokens < 1", ""
    ),
    "mismatch waits less": _replace(
        "kvcap_kv_cache_capacity_mismatch == 1 for: 15m",
        "kvcap_kv_cache_capacity_mismatch == 1\n    for: 10m",
    ),
    "saturation threshold lowered": _replace("> 0.95", "> 0.94"),
    "waiting requests not required": _replace(
        "and on (namespace, pod, engine) max by (namespace, pod, engine) "
        "(vllm:num_requests_waiting) > 0",
        "",
    ),
    "capacity drop compared per pod": _replace(
        "kvcap_kv_cache_capacity_tokens < on (namespace, model_name, engine) group_left",
        "kvcap_kv_cache_capacity_tokens < on (namespace, pod, model_name, engine) group_left",
    ),
    "capacity drop waits less": _replace(
        "max_over_time(kvcap_kv_cache_capacity_tokens[6h]) ) for: 15m",
        "max_over_time(kvcap_kv_cache_capacity_tokens[6h]))\n    for: 10m",
    ),
    "preemption threshold lowered": _replace("> 0.1", "> 0.01"),
    "prefix lifetime threshold raised": _replace("< 10 * 60", "< 60 * 60"),
    "prefix hit rate compared with itself": _replace(
        "(rate(vllm:prefix_cache_hits_total[15m] offset 1h))",
        "(rate(vllm:prefix_cache_hits_total[15m]))",
    ),
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
        "unless on (job, instance, engine, model_name) kvcap_engine_stale == 1", ""
    ),
    "reported capacity not left out": _replace("unless kvcap_kv_cache_capacity_tokens", ""),
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
    assert set(rule["annotations"]) == {"summary", "description", "runbook_url"}
    assert rule["annotations"]["runbook_url"].endswith(f"alerts-and-dashboards.md#{name.lower()}")
    for text in (rule["annotations"]["summary"], rule["annotations"]["description"]):
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
    assert list(capacity.values()) == [2 * plan.figures.kv_cache_size_tokens]
    # Both tiers: the demo's engines offload to CPU (vllm:kv_offload_config_info's tokens).
    offloaded = offload_tier(plan, (simulation.kv_offloading_size_gib or 0) << 30)
    both = 2 * (plan.figures.kv_cache_size_tokens + offloaded["capacity_tokens_at_max_len"])
    prometheus.wait_until(
        lambda: (
            list(
                prometheus.value(
                    f"namespace_model_name:kvcap_kv_total_capacity_tokens:sum{totals}"
                ).values()
            )
            == [both]
        ),
        "the total of both tiers",
    )
    concurrency = prometheus.value(
        f"namespace_model_name:kvcap_kv_cache_max_concurrency:sum{totals}"
    )
    assert list(concurrency.values()) == [pytest.approx(2 * plan.figures.kv_cache_max_concurrency)]
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
    # (The kv_events collector's publishers went away with it too.)
    (down,) = prometheus.query('ALERTS{alertname="KvcapCollectorDown", collector="vllm_http"}')
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


# --- the alerts' settings from the chart's values ----------------------------------------


def _rendered_rules(k8s_tools: K8sTools, *args: str) -> dict[str, Any]:
    spec: dict[str, Any] = one(k8s_tools.render(*args), "PrometheusRule")["spec"]
    return spec


def _alerts(rules: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


def test_alert_settings_come_from_the_values(k8s_tools: K8sTools, tmp_path: Path) -> None:
    values = {
        "prometheusRule": {
            "alertLabels": {"team": "inference", "severity": "overridden-below"},
            "runbookBaseUrl": "https://wiki.example.com/kvcap",
            "alerts": {
                "KvcapKvCacheSaturated": {"threshold": 0.8, "for": "20m", "severity": "page"},
                "KvcapGpuMemoryNearlyFull": {"enabled": False},
                "KvcapEngineStale": {
                    "labels": {"pager": "true"},
                    "runbookUrl": "https://runbooks.example.com/stale",
                },
            },
        }
    }
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    rules = _rendered_rules(k8s_tools, "--values", str(path))
    alerts = _alerts(rules)
    assert set(alerts) == EXPECTED_ALERTS - {"KvcapGpuMemoryNearlyFull"}
    saturated = alerts["KvcapKvCacheSaturated"]
    assert saturated["expr"].strip() == (
        "kvcap_kv_cache_used_tokens / kvcap_kv_cache_capacity_tokens > 0.8"
    )
    assert saturated["for"] == "20m"
    assert saturated["labels"] == {"severity": "page", "team": "inference"}
    assert (
        "more than 0.8 of its GPU KV cache tokens in use for 20m"
        in (saturated["annotations"]["description"])
    )
    assert saturated["annotations"]["runbook_url"] == (
        "https://wiki.example.com/kvcap#kvcapkvcachesaturated"
    )
    stale = alerts["KvcapEngineStale"]
    assert stale["labels"] == {"severity": "warning", "team": "inference", "pager": "true"}
    assert stale["annotations"]["runbook_url"] == "https://runbooks.example.com/stale"
    # The recording rules are unchanged, and promtool takes the result.
    assert rules["groups"][0] == yaml.safe_load(RULES_PATH.read_text(encoding="utf-8"))["groups"][0]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules), encoding="utf-8")
    checked = promtool("check", "rules", "--lint=all", "--lint-fatal", str(tmp_path / "rules.yaml"))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_unit_tests_pin_the_default_settings(k8s_tools: K8sTools, tmp_path: Path) -> None:
    """Other values give other rules: the unit tests, written for the defaults, fail."""
    rules = _rendered_rules(k8s_tools, "--set", "prometheusRule.alerts.KvcapEngineStale.for=10m")
    (tmp_path / "kvcap-rules.yaml").write_text(yaml.safe_dump(rules), encoding="utf-8")
    tests = dict(UNIT_TESTS, rule_files=["kvcap-rules.yaml"])
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests), encoding="utf-8")
    result = promtool("test", "rules", "tests.yaml", cwd=tmp_path)
    assert result.returncode != 0
    assert "KvcapEngineStale" in result.stdout + result.stderr


def test_no_runbook_url_without_a_base(k8s_tools: K8sTools) -> None:
    rules = _rendered_rules(k8s_tools, "--set", "prometheusRule.runbookBaseUrl=")
    assert all("runbook_url" not in a["annotations"] for a in _alerts(rules).values())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "prometheusRule.alerts.KvcapNoSuchAlert.enabled=true"], "KvcapNoSuchAlert"),
        (["--set", "prometheusRule.alerts.KvcapEngineStale.threshold=1"], "threshold"),
        (["--set", "prometheusRule.alerts.KvcapKvCacheSaturated.for=ten"], "for"),
        (["--set-string", "prometheusRule.alerts.KvcapKvCacheSaturated.threshold=x"], "threshold"),
    ],
    ids=["unknown-alert", "threshold-of-an-alert-without-one", "bad-duration", "threshold-text"],
)
def test_bad_alert_settings_are_refused(k8s_tools: K8sTools, args: list[str], message: str) -> None:
    result = k8s_tools.helm_template(*args)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
