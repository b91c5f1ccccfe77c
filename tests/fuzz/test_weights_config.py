"""config.json with its quantization_config -> weights per worker: a kvcap error or a size.

The configs and quantizations are the golden weight cases', broken a little (keys deleted,
values of the wrong type, zero, negative, huge or NaN numbers, nested garbage). Whatever
comes in, the weights model either refuses with one of kvcap's own errors or returns a
positive byte count; it never crashes with a Python error.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.capacity.weights import ParallelLayout, weights_per_worker
from exporter.errors import KvcapError
from tests.fuzz.mutations import mutated

CASES = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "golden" / "weights" / "cases.json").read_text(
        encoding="utf-8"
    )
)
KEYS = tuple(
    sorted(
        {key for c in CASES["configs"].values() for key in c}
        | {key for q in CASES["quantizations"].values() for key in q}
    )
)


@st.composite
def quantized_configs(draw: st.DrawFn) -> Any:
    config = copy.deepcopy(CASES["configs"][draw(st.sampled_from(sorted(CASES["configs"])))])
    quantization = draw(st.sampled_from([None, *sorted(CASES["quantizations"])]))
    if quantization is not None:
        config["quantization_config"] = copy.deepcopy(CASES["quantizations"][quantization])
    return draw(mutated(config, keys=KEYS, max_mutations=3))


layouts = st.builds(
    ParallelLayout,
    st.sampled_from([1, 2, 3, 8]),
    st.sampled_from([1, 2, 3]),
    st.booleans(),
    st.sampled_from([1, 2]),
    st.booleans(),
)


def _layers(config: Any) -> int:
    """Bounded work: a mutated layer count is refused past hf_config's MAX_LAYERS, but a
    hundred thousand real layers still take seconds; such examples are skipped."""
    text = config.get("text_config") if isinstance(config, dict) else None
    source = text if isinstance(text, dict) else config
    layers = source.get("num_hidden_layers") if isinstance(source, dict) else None
    return layers if isinstance(layers, int) else 0


@settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(config=quantized_configs().filter(lambda c: _layers(c) <= 200), layout=layouts)
def test_mutated_configs_give_a_kvcap_error_or_a_size(config: Any, layout: ParallelLayout) -> None:
    try:
        weights = weights_per_worker(config, layout)
    except KvcapError:
        return
    assert weights.bytes_per_worker > 0
    assert weights.bytes_per_worker == max(weights.stage_bytes)
