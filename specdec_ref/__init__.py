"""specdec_ref: a small, exact reference implementation of speculative decoding.

One module per chapter of the book:

* `sampling`: logits -> the distribution actually sampled (temperature, top-k, top-p)
* `drafting` (chapter 2): the draft model proposes K tokens and keeps q (K, V)
* `verification` (chapter 3): one target pass gives p (K + 1, V)
* `rejection` (chapter 4): accept / reject so the output is distributed as p
* `kv_cache` (chapter 5): both models' caches, rolled back after rejections
* `decoder`: the assembled loop, `speculative_generate`, and the baseline
* `trees/` (chapter 8): a tree of drafts verified in one pass, `tree_speculative_generate`
* `cross_vocab/` (chapter 9): a draft with a tokenizer of its own, through text
  (`TextDrafter`) or the tokens both vocabularies share (`SharedVocabDrafter`)
* `heads/` (chapter 10): draft heads on the target's own features (Medusa, EAGLE)
* `models`: `load_pair("tiny" | "gpt2" | "qwen2.5" | "tiny-cross" | "pythia-gpt2")`, the
  embedded tiny pairs and real ones
"""

import os

# On a CPU, oneDNN runs torch's bfloat16 matrix products and the prepacked layers of
# `packed`, and keeps the kernels it compiles, one per shape, in a cache of 1,024. A
# speculative loop meets more shapes than that (rows x context length, for every
# matrix product), and would compile its kernels again on every pass, which slows
# every target pass. Keep more, unless the environment says otherwise (oneDNN reads
# this when it compiles its first kernel); the benchmark's reports record the capacity
# they ran with (`onednn_kernel_cache` in specdec_ref/data/bench-*.json).
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "16384")

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
