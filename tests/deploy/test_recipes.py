"""The PromQL recipes of docs/metrics.md that join kvcap with other exporters (NVIDIA's
dcgm-exporter) or count per replica, evaluated by promtool on series shaped like theirs."""

from __future__ import annotations

import re
from pathlib import Path

from tests.integration.prometheus import promtool_eval

ROOT = Path(__file__).resolve().parents[2]
METRICS_DOC = ROOT / "docs" / "metrics.md"


def recipes_after(heading: str) -> list[str]:
    """The queries (blank-line separated) of the first promql block after `heading`."""
    text = METRICS_DOC.read_text(encoding="utf-8")
    start = text.index(heading)
    block = re.search(r"```promql\n(.*?)```", text[start:], re.DOTALL)
    assert block, heading
    return [q.strip() for q in block[1].split("\n\n") if q.strip()]


ENGINE = 'namespace="llm",pod="vllm-0",engine="0",model_name="m",worker="{w}"'
KV = "kvcap_kv_cache_bytes{{" + ENGINE + ',gpu="{g}",uuid="{u}"}}'
GPU_INFO = "kvcap_engine_gpu_info{{" + ENGINE + ',gpu="{g}",uuid="{u}"}}'
# dcgm-exporter's labels, its pod mapping on.
DCGM = (
    '{metric}{{job="{job}",gpu="{g}",UUID="{u}",Hostname="node-1",'
    'modelName="NVIDIA H100 80GB HBM3",pod="vllm-0",namespace="llm",container="vllm"}}'
)


def test_dcgm_exporter_join(tmp_path: Path) -> None:
    share, utilisation = recipes_after("With NVIDIA's dcgm-exporter")
    gpus = [("0", "0", "GPU-aaaa"), ("1", "1", "GPU-bbbb")]
    series = []
    for worker, gpu, uuid in gpus:
        labels = {"w": worker, "g": gpu, "u": uuid}
        series.append({"series": KV.format(**labels), "values": f"{60 * 2**30}x5"})
        series.append({"series": GPU_INFO.format(**labels), "values": "1x5"})
        # dcgm-exporter: MiB, its own labels; GPU 1 scraped twice (two jobs).
        used_mib = 75 * 1024 if gpu == "0" else 72 * 1024
        copies = 2 if gpu == "1" else 1
        for job in (f"dcgm{n}" for n in range(copies)):
            used = DCGM.format(metric="DCGM_FI_DEV_FB_USED", job=job, g=gpu, u=uuid)
            series.append({"series": used, "values": f"{used_mib}x5"})
            util = DCGM.format(metric="DCGM_FI_DEV_GPU_UTIL", job=job, g=gpu, u=uuid)
            series.append({"series": util, "values": f"{90 + int(gpu)}x5"})
    cases = [
        {
            "expr": share,
            "eval_time": "2m",
            "exp_samples": [
                {"labels": '{uuid="GPU-aaaa"}', "value": 60 / 75},
                {"labels": '{uuid="GPU-bbbb"}', "value": 60 / 72},
            ],
        },
        {
            "expr": utilisation,
            "eval_time": "2m",
            "exp_samples": [
                {
                    "labels": "{" + ENGINE.format(w=w) + f',uuid="{u}"}}',
                    "value": 90 + int(g),
                }
                for w, g, u in gpus
            ],
        },
    ]
    promtool_eval(tmp_path, series, cases)


def test_free_tokens_per_replica(tmp_path: Path) -> None:
    (free,) = recipes_after("Free KV cache tokens per replica of a model")
    cap = 'kvcap_kv_cache_capacity_tokens{{namespace="llm",pod="{p}",engine="{e}",model_name="m"}}'
    used = 'kvcap_kv_cache_used_tokens{{namespace="llm",pod="{p}",engine="{e}",model_name="m"}}'
    series = [
        {"series": cap.format(p="a", e="0"), "values": "100000x5"},
        {"series": cap.format(p="a", e="1"), "values": "100000x5"},
        {"series": cap.format(p="b", e="0"), "values": "100000x5"},
        {"series": used.format(p="a", e="0"), "values": "30000x5"},
        {"series": used.format(p="a", e="1"), "values": "20000x5"},
        {"series": used.format(p="b", e="0"), "values": "50000x5"},
    ]
    # (300000 - 100000) tokens free over 2 replicas.
    cases = [
        {
            "expr": free,
            "eval_time": "2m",
            "exp_samples": [{"labels": '{namespace="llm",model_name="m"}', "value": 100000}],
        }
    ]
    promtool_eval(tmp_path, series, cases)
