"""A real Prometheus server on loopback, started by a test and queried over its HTTP API."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from tests.support import free_port, wait_for
from tests.tools import require_tool


class Prometheus:
    def __init__(
        self,
        workdir: Path,
        targets: list[str],
        scrape_interval: str = "1s",
        labels: dict[str, str] | None = None,
    ) -> None:
        self.binary = require_tool("prometheus")
        self.port = free_port()
        self.workdir = workdir
        config = workdir / "prometheus.yml"
        config.write_text(
            "global:\n"
            f"  scrape_interval: {scrape_interval}\n"
            f"  scrape_timeout: {scrape_interval}\n"
            "scrape_configs:\n"
            "  - job_name: kvcap\n"
            f"    static_configs: [{{targets: {json.dumps(targets)}, "
            f"labels: {json.dumps(labels or {})}}}]\n"
        )
        self.config = config
        self.process: subprocess.Popen[bytes] | None = None
        self.log = (workdir / "prometheus.log").open("wb")

    def __enter__(self) -> Prometheus:
        self.process = subprocess.Popen(
            [
                self.binary,
                f"--config.file={self.config}",
                f"--storage.tsdb.path={self.workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        self.wait_until(lambda: self._get("/-/ready") is not None, "Prometheus ready", 30)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()

    def _get(self, path: str) -> bytes | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=2) as r:
                body: bytes = r.read()
                return body
        except OSError:
            return None

    def query(self, promql: str, at: float | None = None) -> list[dict[str, Any]]:
        """The instant vector of `promql` (now, or at the Unix time `at`). A query Prometheus
        does not answer raises: it is not an empty result (a loaded CI machine can hold
        an answer back for seconds, and "no alerts" must not pass for "no answer")."""
        params = {"query": promql} | ({"time": f"{at:.3f}"} if at is not None else {})
        path = "/api/v1/query?" + urllib.parse.urlencode(params)
        body = wait_for(
            lambda: self._answer(path), 30, f"Prometheus answering {promql!r}", interval_s=0.5
        )
        answer = json.loads(body)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def _answer(self, path: str) -> bytes | None:
        """The API's JSON answer, an error's included (a bad query is a 400 with its error)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as r:
                body: bytes = r.read()
                return body
        except urllib.error.HTTPError as error:
            return error.read()
        except OSError:
            return None

    def targets_up(self) -> bool:
        return any(float(r["value"][1]) == 1 for r in self.query("up"))

    @staticmethod
    def wait_until(condition: Any, what: str, timeout_s: float = 20) -> None:
        wait_for(condition, timeout_s, what, interval_s=0.2)


def promtool_eval(tmp_path: Path, series: list[dict[str, str]], cases: Sequence[object]) -> None:
    """`promtool test rules` of PromQL `cases` over `series`, in `tmp_path`; fails on a miss."""
    (tmp_path / "empty-rules.yaml").write_text("groups: []\n", encoding="utf-8")
    tests = {
        "rule_files": ["empty-rules.yaml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": cases}],
    }
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump(tests), encoding="utf-8")
    result = subprocess.run(
        [require_tool("promtool"), "test", "rules", "tests.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
