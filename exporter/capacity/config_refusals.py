"""How releases before auto-fit (0.14) answer `--max-model-len -1`: each its own refusal."""

from __future__ import annotations

from exporter.capacity.releases import RuleSet
from exporter.errors import UnsupportedConfiguration

# vLLM's message is pydantic's, which names its own version in the link: the records were
# made with pydantic 2.14 (the environment's, not the release's choice).
_PYDANTIC_ERRORS = "https://errors.pydantic.dev/2.14/v"
# EngineArgs' `vllm serve` default of max_num_seqs: 1024 on a GPU of 70 GiB or more (the
# H100 whose 8,192 batched tokens kvcap plans CUDA with), 128 per worker on CPU.
_CUDA_MAX_NUM_SEQS = 1024
_CPU_MAX_NUM_SEQS_PER_WORKER = 128


def _at_least_one(field: str, value: int) -> str:
    return (
        f"{field}\n  Input should be greater than or equal to 1 [type=greater_than_equal, "
        f"input_value={value}, input_type=int]\n"
        f"    For further information visit {_PYDANTIC_ERRORS}/greater_than_equal"
    )


def refuse_minus_one(
    release: RuleSet, *, is_cpu: bool, world_size: int, batched_tokens_given: bool
) -> None:
    """Raise the release's refusal of `--max-model-len -1` (nothing from 0.14 on: it fits)."""
    if release.max_model_len_minus_one in ("auto_fit", "planned_as_length"):
        return  # 0.10 plans -1 as a length: the capacity code divides by its 0 blocks
    if release.max_model_len_minus_one == "model_config_refuses":
        message = (
            "1 validation error for ModelConfig\nmax_model_len\n  Input should be greater "
            "than 0 [type=greater_than, input_value=-1, input_type=int]\n"
            f"    For further information visit {_PYDANTIC_ERRORS}/greater_than"
        )
    elif batched_tokens_given:
        raise UnsupportedConfiguration(
            f"vLLM {release.name} does not fit --max-model-len -1 to the KV memory (0.14 and "
            "later do); with --max-num-batched-tokens given, how it fails is not modelled"
        )
    else:
        # EngineArgs derives the defaults from the length: batched tokens
        # min(max_num_seqs x -1, default) and max_num_seqs min(default, that), both negative.
        seqs = _CPU_MAX_NUM_SEQS_PER_WORKER * world_size if is_cpu else _CUDA_MAX_NUM_SEQS
        message = (
            "2 validation errors for SchedulerConfig\n"
            f"{_at_least_one('max_num_batched_tokens', -seqs)}\n"
            f"{_at_least_one('max_num_seqs', -seqs)}"
        )
    error = UnsupportedConfiguration(message)
    error.vllm_error_type = "ValidationError"
    raise error
