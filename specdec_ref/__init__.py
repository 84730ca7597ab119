"""specdec_ref: a small, exact reference implementation of speculative decoding.

One module per chapter of the book:

* `sampling`: logits -> the distribution actually sampled (temperature, top-k, top-p)
* `drafting` (chapter 2): the draft model proposes K tokens and keeps q (K, V)
* `verification` (chapter 3): one target pass gives p (K + 1, V)
* `rejection` (chapter 4): accept / reject so the output is distributed as p
* `kv_cache` (chapter 5): both models' caches, rolled back after rejections
* `decoder`: the assembled loop, `speculative_generate`, and the baseline
* `models`: `load_pair("tiny" | "gpt2" | "qwen2.5")`, the embedded tiny pair and real ones
"""

from .decoder import (
    GenerationOutput,
    GenerationStats,
    IterationRecord,
    autoregressive_generate,
    speculative_generate,
)
from .models import load_pair
from .rejection import accept_reject, emission_distribution, residual_distribution
from .sampling import SamplingConfig, logits_to_probs
from .schedules import FixedDraftLength, HeuristicDraftLength, ModelBasedDraftLength

__all__ = [
    "FixedDraftLength",
    "GenerationOutput",
    "GenerationStats",
    "HeuristicDraftLength",
    "IterationRecord",
    "ModelBasedDraftLength",
    "SamplingConfig",
    "accept_reject",
    "autoregressive_generate",
    "emission_distribution",
    "load_pair",
    "logits_to_probs",
    "residual_distribution",
    "speculative_generate",
]

__version__ = "0.1.0"
