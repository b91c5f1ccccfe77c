"""Record a live vLLM's KV event stream into a test fixture (tests/fixtures/kv_events/).

Usage: python scripts/record_kv_events.py --url http://127.0.0.1:8000 \
    --endpoint tcp://127.0.0.1:5557 --out stream.msgpack \
    [--prompts N] [--first-index I] [--prefix-tokens P]

Subscribes first, then sends deterministic token-id prompts (a shared prefix and a distinct
suffix each) to /v1/completions, and writes every multipart frame it received, as received,
with what the test needs to know about the engine.
"""

from __future__ import annotations

import argparse
import json
import time
import urllib.request
from pathlib import Path

import msgspec
import zmq


def prompt_tokens(index: int, prefix_tokens: int, suffix_tokens: int, vocab: int) -> list[int]:
    prefix = [3 + (i * 7) % (vocab - 3) for i in range(prefix_tokens)]
    suffix = [3 + (index * 131 + i * 17) % (vocab - 3) for i in range(suffix_tokens)]
    return prefix + suffix


def complete(url: str, model: str, tokens: list[int]) -> None:
    body = json.dumps({"model": model, "prompt": tokens, "max_tokens": 1}).encode()
    request = urllib.request.Request(
        f"{url}/v1/completions", body, {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        response.read()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--endpoint", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--first-index", type=int, default=0, help="the first prompt's number")
    parser.add_argument("--prefix-tokens", type=int, default=48)
    parser.add_argument("--suffix-tokens", type=int, default=36)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--note", default="")
    args = parser.parse_args()
    models = json.load(urllib.request.urlopen(f"{args.url}/v1/models", timeout=10))
    model = models["data"][0]["id"]
    version = json.load(urllib.request.urlopen(f"{args.url}/version", timeout=10))["version"]
    sources = json.load(urllib.request.urlopen(f"{args.url}/kv_event_sources", timeout=10))
    socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"")
    socket.connect(args.endpoint)
    time.sleep(1.0)  # ZMQ's slow joiner: let the subscription reach the publisher
    prompts = [
        prompt_tokens(i, args.prefix_tokens, args.suffix_tokens, args.vocab)
        for i in range(args.first_index, args.first_index + args.prompts)
    ]
    for tokens in prompts:
        complete(args.url, model, tokens)
    frames: list[list[bytes]] = []
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        if socket.poll(200):
            frames.append(socket.recv_multipart())
            deadline = time.monotonic() + 2.0
    fixture = {
        "recorded_from": "live vLLM",
        "vllm_version": version,
        "note": args.note,
        "kv_event_sources": sources,
        "prompts": prompts,
        "frames": frames,
    }
    args.out.write_bytes(msgspec.msgpack.encode(fixture))
    print(f"{len(frames)} frames -> {args.out}")


if __name__ == "__main__":
    main()
