"""Prometheus scraping while the engines are replaced as fast as a source can replace them.

Each publish replaces the whole engine set with a new generation: its own instance ids,
block count and number of engines. Every scrape must be one generation, whole: a body
that mixes two (an engine of the old set next to one of the new, a family already
rendered from the new snapshot beside one from the old) would be a torn read.
"""

from __future__ import annotations

import gzip
import http.client
import json
import threading
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families as text_families
from structlog.testing import capture_logs

from exporter.capacity import EngineCapacity
from exporter.exposition import build_exposition
from exporter.state import EngineReport, StateStore
from tests.faults.harness import running_exporter

SCRAPERS = 4
DURATION_S = 1.5
TARGET = "ipc:///run/kvcap/handshake.sock"
# (Accept, Accept-Encoding) of the scrapers: Prometheus asks for OpenMetrics and gzip.
VARIANTS = [
    ("", ""),
    ("", "gzip"),
    ("application/openmetrics-text; version=1.0.0", ""),
    ("application/openmetrics-text; version=1.0.0", "gzip"),
]
PER_ENGINE = (
    "kvcap_engine_info",
    "kvcap_kv_cache_info",
    "kvcap_kv_cache_capacity_tokens",
    "kvcap_kv_cache_blocks",
    "kvcap_kv_cache_max_concurrency",
    "kvcap_max_model_len_tokens",
    "kvcap_engine_stale",
)


def generation(number: int) -> list[EngineReport]:
    """1 to 3 engines, all carrying the generation in their instance id and block count."""
    blocks = 1000 + number
    return [
        EngineReport(
            engine=str(index),
            model_name="m",
            instance_id=f"gen-{number}",
            vllm_version="0.33.0",
            reported=EngineCapacity(
                num_gpu_blocks=blocks,
                block_size=16,
                kv_cache_size_tokens=16 * blocks,
                kv_cache_max_concurrency=16 * blocks / 4096,
                max_model_len=4096,
            ),
        )
        for index in range(number % 3 + 1)
    ]


@dataclass
class Findings:
    scrapes: int = 0
    generations: set[int] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)


def check_body(text: str, openmetrics: bool) -> int:
    """The one generation this body shows; AssertionError when it is torn."""
    parse = openmetrics_families if openmetrics else text_families
    samples: dict[str, list[dict[str, str]]] = {}
    values: dict[str, dict[str, float]] = {}
    for family in parse(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
            if "engine" in sample.labels:
                values.setdefault(sample.name, {})[sample.labels["engine"]] = sample.value
    instances = {labels["instance_id"] for labels in samples.get("kvcap_engine_info", [])}
    assert len(instances) == 1, f"instance ids of two generations: {instances}"
    number = int(instances.pop().removeprefix("gen-"))
    expected = {str(index) for index in range(number % 3 + 1)}
    for name in PER_ENGINE:
        engines = {labels["engine"] for labels in samples.get(name, [])}
        assert engines == expected, f"{name}: engines {engines}, generation {number}"
    assert set(values["kvcap_kv_cache_blocks"].values()) == {1000 + number}
    assert set(values["kvcap_kv_cache_capacity_tokens"].values()) == {16 * (1000 + number)}
    return number


def connect(url: str) -> http.client.HTTPConnection:
    """One keep-alive connection, as each Prometheus server keeps one per target."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=5)


def scraper(url: str, variant: int, stop: threading.Event, findings: Findings) -> None:
    accept, encoding = VARIANTS[variant % len(VARIANTS)]
    connection = connect(url)
    last = -1
    try:
        while not stop.is_set():
            connection.request(
                "GET", "/metrics", headers={"Accept": accept, "Accept-Encoding": encoding}
            )
            response = connection.getresponse()
            body = response.read()
            findings.scrapes += 1
            if response.status != 200:
                findings.problems.append(f"status {response.status}")
                continue
            if response.getheader("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            try:
                number = check_body(body.decode("utf-8"), openmetrics=bool(accept))
            except Exception as error:  # recorded, and the test fails with it
                findings.problems.append(f"{type(error).__name__}: {error}")
                continue
            # Snapshots are swapped whole and in order: a scraper never goes back.
            if number < last:
                findings.problems.append(f"generation {number} after {last}")
            last = number
            findings.generations.add(number)
    finally:
        connection.close()


def engines_scraper(url: str, stop: threading.Event, findings: Findings) -> None:
    connection = connect(url)
    try:
        while not stop.is_set():
            connection.request("GET", "/engines")
            response = connection.getresponse()
            document = json.loads(response.read())
            instances = {engine["instance_id"] for engine in document["engines"]}
            if response.status != 200 or len(instances) != 1:
                findings.problems.append(f"/engines {response.status}: {instances}")
                continue
            number = int(instances.pop().removeprefix("gen-"))
            if len(document["engines"]) != number % 3 + 1:
                findings.problems.append(f"/engines: {len(document['engines'])} engines")
    finally:
        connection.close()


def test_every_scrape_during_rapid_replacement_is_one_whole_generation() -> None:
    store = StateStore()
    with capture_logs(), running_exporter([], store=store) as exporter:
        store.publish("handshake", TARGET, generation(0))
        stop = threading.Event()
        findings = [Findings() for _ in range(SCRAPERS + 1)]
        threads = [
            threading.Thread(target=scraper, args=(exporter.server.url, i, stop, findings[i]))
            for i in range(SCRAPERS)
        ]
        threads.append(
            threading.Thread(
                target=engines_scraper, args=(exporter.server.url, stop, findings[SCRAPERS])
            )
        )
        for thread in threads:
            thread.start()
        published = 0
        deadline = time.monotonic() + DURATION_S
        while time.monotonic() < deadline:
            published += 1
            store.publish("handshake", TARGET, generation(published))
            time.sleep(0.0005)
        stop.set()
        for thread in threads:
            thread.join(10)
    problems = [problem for found in findings for problem in found.problems]
    assert problems == [], problems[:5]
    scrapes = sum(found.scrapes for found in findings[:SCRAPERS])
    seen = set().union(*(found.generations for found in findings[:SCRAPERS]))
    assert scrapes >= 40, f"only {scrapes} scrapes"
    # The replacement really happened under the scrapers: they saw many generations.
    assert len(seen) >= 20, f"{len(seen)} generations seen of {published} published"


def _body(number: int) -> str:
    store = StateStore()
    with capture_logs():
        store.publish("handshake", TARGET, generation(number))
    return build_exposition(store.snapshot, process=False).body().content.decode()


def test_the_check_sees_a_torn_body() -> None:
    """A body whose engine_info comes from one generation and the rest from the next."""
    assert check_body(_body(4), openmetrics=False) == 4
    old, new = _body(4).split("# HELP "), _body(5).split("# HELP ")
    torn = "# HELP ".join(
        o if o.startswith("kvcap_engine_info ") else n for o, n in zip(old, new, strict=True)
    )
    with pytest.raises(AssertionError):
        check_body(torn, openmetrics=False)
