"""The start-up log parser on the shapes real logs take: prefixes, colours, timestamps,
interleaved DP engines, the two-line and one-line capacity forms, hard wraps."""

from __future__ import annotations

from exporter.capacity.startup_log import engine_index, parse_startup_log, split_line

H = "INFO 09-03 00:40:55 [kv_cache_utils.py:849] "


def test_prefixes_colours_and_timestamps_are_stripped() -> None:
    assert split_line(
        f"\x1b[1;36m(EngineCore_DP1 pid=42)\x1b[0;0m {H}GPU KV cache size: 1 tokens"
    ) == (
        "EngineCore_DP1 pid=42",
        "GPU KV cache size: 1 tokens",
        True,
    )
    assert split_line(f"2025-09-03T00:40:55.123456Z (VllmWorker TP1 pid=7) {H}x")[0] == (
        "VllmWorker TP1 pid=7"
    )
    ray = f"(EngineCore_0 pid=1) (RayWorkerWrapper pid=345, ip=10.0.0.1) {H}x"
    assert split_line(ray)[0] == "RayWorkerWrapper pid=345"
    assert split_line("plain text, no vLLM header") == ("", "plain text, no vLLM header", False)
    assert engine_index("EngineCore_DP3 pid=1") == 3
    assert engine_index("EngineCore_0 pid=1") == 0
    assert engine_index("Worker pid=1") == 0


def test_interleaved_dp_engines_are_kept_apart() -> None:
    lines = [
        f"(EngineCore_DP1 pid=2) {H}CPU KV cache size: 200 tokens, Maximum concurrency for "
        "4,096 tokens per request: 2.00x",
        f"(EngineCore_DP0 pid=1) {H}CPU KV cache size: 100 tokens, Maximum concurrency for "
        "4,096 tokens per request: 1.00x",
        f"(EngineCore_DP0 pid=1) {H}kv cache group sizes (128, 64)",
    ]
    log = parse_startup_log(lines)
    assert [(e.engine, e.kv_cache_size_tokens) for e in log.engines] == [(0, 100), (1, 200)]
    assert log.engines[0].group_block_sizes == (128, 64)
    assert log.engines[1].max_concurrency == 2.0


def test_the_two_line_form_printed_twice_counts_once() -> None:
    size = f"(EngineCore_0 pid=1) {H}GPU KV cache size: 450,192 tokens"
    concurrency = (
        f"(EngineCore_0 pid=1) {H}Maximum concurrency for 16,384 tokens per request: 27.48x"
    )
    progress = "Capturing CUDA graphs:  99%|#####| 66/67"
    (engine,) = parse_startup_log([size, concurrency, size, concurrency + progress]).engines
    assert engine.lines == (
        "GPU KV cache size: 450,192 tokens",
        "Maximum concurrency for 16,384 tokens per request: 27.48x",
    )
    assert (engine.kv_cache_size_tokens, engine.max_model_len) == (450192, 16384)


def test_hard_wrapped_lines_are_joined() -> None:
    head = (
        f"(APIServer pid=1) {H}non-default args: "
        "{'model': 'Qwen2-7B-Instruct', 'port': 8081, 'max_model_len'"
    )
    assert len(head) >= 100
    log = parse_startup_log([head, ": 16384, 'gpu_memory_utilization': 0.25}"])
    assert log.non_default_args == {
        "model": "Qwen2-7B-Instruct",
        "port": 8081,
        "max_model_len": 16384,
        "gpu_memory_utilization": 0.25,
    }


def test_worker_memory_refusals_and_overrides_are_read() -> None:
    lines = [
        f"(Worker_TP1 pid=9) {H}Model loading took 14.99 GiB memory and 5.2 seconds",
        f"(Worker_TP1 pid=9) {H}Available KV cache memory: -2.14 GiB",
        f"(Worker_TP1 pid=9) {H}Graph capturing finished in 3 secs, took 0.50 GiB",
        f"(EngineCore_DP0 pid=1) {H}Overriding num_gpu_blocks=5000 with num_gpu_blocks_override=64",
        f"(EngineCore_DP0 pid=1) {H}Auto-fit max_model_len: reduced from 131072 to 8192 to fit",
        "(EngineCore_DP0 pid=1) ValueError: No available memory for the cache blocks. Try it.",
        f"(EngineCore_DP0 pid=1) {H}vLLM API server version 0.18.1",
    ]
    log = parse_startup_log(lines)
    (worker,) = log.workers
    assert (worker.model_loading_gib, worker.available_kv_gib, worker.cuda_graph_gib) == (
        14.99,
        -2.14,
        0.5,
    )
    (engine,) = log.engines
    assert engine.override == (5000, 64)
    assert engine.auto_fit == (131072, 8192)
    assert log.refusals == ("No available memory for the cache blocks. Try it.",)
    assert log.version == "0.18.1"


def test_another_engines_log_is_named_not_read() -> None:
    log = parse_startup_log(["[2025-06-01 10:00:00] server_args=ServerArgs(model_path='x')"])
    assert log.other_engine == "SGLang"
    assert log.engines == ()
    assert log.vllm_lines == 0


def test_the_platforms_ssm_dtype_reset_is_read() -> None:
    line = (
        "(APIServer pid=1) WARNING 12-02 03:38:07 [cpu.py:134] "
        "Reset SSM cache type to float32 for AMX mamba attention."
    )
    assert parse_startup_log([line]).ssm_state_float32
    aligned = (
        "(Worker pid=1) INFO 12-02 03:39:39 [interface.py:911] Setting attention block size "
        "to 640 tokens to ensure that attention page size is >= mamba page size."
    )
    assert parse_startup_log([aligned]).attention_block_size == 640
    assert not parse_startup_log(
        ["(APIServer pid=1) INFO 01-01 00:00:00 [x.py:1] x"]
    ).ssm_state_float32
