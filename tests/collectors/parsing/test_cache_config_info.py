"""Typed `vllm:cache_config_info` records: read by key, "None" as None, errors name the label."""

from __future__ import annotations

import pytest

from exporter.collectors.parsing import (
    CacheConfigInfo,
    MalformedExposition,
    Sample,
    parse_cache_config_info,
    parse_vllm_metrics,
)

INFO = "vllm:cache_config_info"


def info(**labels: str) -> Sample:
    return Sample(INFO, labels, 1.0)


def test_a_0_33_series() -> None:
    body = (
        "vllm:cache_config_info{"
        '_block_size_resolved="True",block_size="16",cache_dtype="fp8",'
        'effective_attention_block_size="16",enable_prefix_caching="True",engine="0",'
        'gpu_memory_utilization="0.92",kv_cache_max_concurrency="4.559147086785278",'
        'kv_cache_memory_bytes="None",kv_cache_size_tokens="597576",mamba_block_size="None",'
        'num_gpu_blocks="134276",num_gpu_blocks_override="None",sliding_window="4096",'
        'user_specified_block_size="False"} 1.0\n'
    )
    (record,) = parse_cache_config_info(parse_vllm_metrics(body)[INFO])
    assert record == CacheConfigInfo(
        engine="0",
        labels=record.labels,
        num_gpu_blocks=134276,
        block_size=16,
        kv_cache_size_tokens=597576,
        kv_cache_max_concurrency=4.559147086785278,
        gpu_memory_utilization=0.92,
        cache_dtype="fp8",
        enable_prefix_caching=True,
        num_gpu_blocks_override=None,
        sliding_window=4096,
        mamba_block_size=None,
        effective_attention_block_size=16,
        kv_cache_memory_bytes=None,
        user_specified_block_size=False,
    )
    assert record.labels["_block_size_resolved"] == "True"
    assert len(record.labels) == 15


def test_absent_none_and_empty_labels_are_none() -> None:
    (record,) = parse_cache_config_info(
        [info(engine="1", num_gpu_blocks="None", block_size="", swap_space="4")]
    )
    assert record.engine == "1"
    assert record.num_gpu_blocks is None
    assert record.block_size is None
    assert record.kv_cache_size_tokens is None
    assert record.enable_prefix_caching is None
    assert record.labels == {
        "engine": "1",
        "num_gpu_blocks": "None",
        "block_size": "",
        "swap_space": "4",
    }


def test_one_record_per_engine_in_order_of_first_appearance() -> None:
    records = parse_cache_config_info(
        [
            info(engine="1", block_size="16"),
            info(engine="0", block_size="16"),
            info(engine="1", block_size="32"),
        ]
    )
    assert [(record.engine, record.block_size) for record in records] == [("1", 32), ("0", 16)]


def test_a_series_without_engine_label() -> None:
    (record,) = parse_cache_config_info([info(num_gpu_blocks="100")])
    assert record.engine == ""
    assert record.num_gpu_blocks == 100


def test_integral_float_text_is_an_integer() -> None:
    (record,) = parse_cache_config_info([info(engine="0", kv_cache_size_tokens="597576.0")])
    assert record.kv_cache_size_tokens == 597576


def test_large_integers_are_exact() -> None:
    (record,) = parse_cache_config_info([info(engine="0", kv_cache_memory_bytes=str(2**53 + 1))])
    assert record.kv_cache_memory_bytes == 2**53 + 1


@pytest.mark.parametrize(
    ("label", "value"),
    [
        ("num_gpu_blocks", "many"),
        ("num_gpu_blocks", "1.5"),
        ("block_size", "inf"),
        ("kv_cache_size_tokens", "[]"),
        ("kv_cache_max_concurrency", "high"),
        ("gpu_memory_utilization", "0,9"),
        ("enable_prefix_caching", "true"),
        ("user_specified_block_size", "1"),
        ("sliding_window", "[4096, None]"),
        ("kv_cache_memory_bytes", "8GiB"),
        ("num_gpu_blocks", "-1"),
        ("kv_cache_size_tokens", "-597576.0"),
        ("kv_cache_max_concurrency", "nan"),
        ("kv_cache_max_concurrency", "-2.5"),
        ("gpu_memory_utilization", "inf"),
        ("num_gpu_blocks", "9" * 5000),
        ("num_gpu_blocks", "9" * 25),
        ("num_gpu_blocks", "9" * 20),  # exact, yet past int64
    ],
)
def test_a_value_vllm_would_not_write_names_the_label(label: str, value: str) -> None:
    with pytest.raises(MalformedExposition, match=rf"engine '3': label {label}="):
        parse_cache_config_info([info(engine="3", **{label: value})])


def test_labels_outside_the_record_are_never_parsed() -> None:
    (record,) = parse_cache_config_info([info(engine="0", prefix_match_unit="[1, 2]")])
    assert record.labels["prefix_match_unit"] == "[1, 2]"
