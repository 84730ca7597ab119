"""The performance kernels: the same arithmetic as the models, in less time.

No chapter module (`drafting` to `decoder`, the tree decoder included) imports
them; chapter 6 and the benchmark do. The tree decoder grows a draft's trees in
these buffers through a protocol of its own (`tree_forward.TreeLogitsSource`:
`tree_logits` and `keep`), which `StaticForward` and `LeanForward` implement; the
rule is checked by `tests/test_layout.py`. Each kernel changes only how long a pass takes,
never what it computes (their tests compare logits and greedy tokens with the
plain models'):

* `blocks`: a GPT-2 or Llama-style model cut into embed / blocks / head, so a pass
  can be run with an attention over a cache this package owns;
* `static`: `StaticForward`, a `kv_cache.LogitsSource` over a preallocated cache
  (rollback moves a length) that replays one CUDA graph per pass size on a GPU,
  and runs tree passes and compactions for the tree decoder;
* `packed`: linear layers prepacked by oneDNN, so that on a CPU a pass over K + 1
  tokens costs about one step;
* `batch_invariant`: attention whose every row is bitwise a one-token step's, so
  greedy stays exact in bfloat16;
* `lean`: `LeanForward`, a Llama-style draft's cached pass without the framework's
  per-call work: `StaticForward` run eagerly over the cached length;
* `prepared`: `prepare(draft_model, target_model)`, all of the above that fits the
  device in one call, and `FastPair.describe()`, what it chose.

One call prepares a pair for the device it is on; pass what it returns as the models:

    fast = prepare(draft_model, target_model)
    speculative_generate(fast.target, fast.draft, input_ids, max_new_tokens=..., sampling=sampling, ...)

A logits source (`StaticForward`, `LeanForward`) can also be passed by hand, as the
target or as the draft:

    target = StaticForward(target_model, max_length=n + max_new_tokens)
    speculative_generate(target, StaticForward(draft_model, max_length=n + max_new_tokens), input_ids, ...)

and the output is the same as with the models themselves (exactly, up to float
rounding in the logits): only the time per pass changes.
"""

from .blocks import FAMILIES, static_unsupported
from .lean import LeanForward
from .prepared import FastPair, plan, prepare
from .static import StaticForward

__all__ = ["FAMILIES", "FastPair", "LeanForward", "StaticForward", "plan", "prepare", "static_unsupported"]
