"""What the benchmark and the demo run on: a model pair, a prompt set, and the pair's pass costs.

`load_bench_pair` returns a pair `specdec_ref.models.load_pair` knows (the embedded
tiny pair by default) or, with `--pair random`, random-init Llama models of the tiny
pair's shapes (or others), and says which in `BenchPair.description`.

A random pair agrees with itself no better than chance, which would make every
speculative arm look hopeless for reasons that have nothing to do with the code. So
the random draft *is* the target's first layer(s) with its embeddings and head (a
truncated copy), and the target's deeper layers write into the residual stream with
weights scaled by `deep_layer_scale`: the smaller the scale, the more often the two
agree. The costs are those of the real shapes; alpha comes from this construction.

`measure_costs` times single cached passes with `measure.measure_pass_latency` (the
`kv_cache.CachedForward` path the decoder uses): c = draft 1-token pass / target 1-token pass, and v(K) = target pass
over K + 1 tokens / target 1-token pass (what `analysis` calls the cost ratio and the
verification cost). Timed alone, a draft pass finds its weights in the CPU's caches; in
the decoder it runs right after a target pass has streamed the target's weights through
them, and costs more. `loop_draft_seconds` times it that way: the loop's c.

Invariant: every pair returned here has EOS switched off in both models' generation
configs, so every arm of the benchmark produces exactly `max_new_tokens` tokens.
"""

from __future__ import annotations

import importlib
import time
from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from ..fast.lean import LeanForward, lean_pass_seconds, lean_unsupported
from ..kv_cache import CachedForward, LogitsSource
from ..measure import measure_pass_latency
from ..models import PAIRS, load_pair
from ..timing import Timing, synchronize
from ..validation import check_integer, context_length, vocab_size

# Prompts for a pair with a tokenizer when `specdec_ref.training.corpus` cannot provide held-out ones.
FALLBACK_PROMPTS = (
    "The for statement is used to iterate over the elements of a sequence",
    "Return a new sorted list from the items in iterable.",
    'def read_config(path):\n    """Read the configuration file at path and',
    "An exception is raised when an operation or function is applied to an object of",
    "The with statement is used to wrap the execution of a block with methods",
    'class Queue:\n    """Create a queue object with a given maximum size.',
    "If the optional argument is given, the function returns",
    "Dictionaries can be created by placing a comma-separated list of",
)


@dataclass(frozen=True)
class RandomPairShape:
    """Shapes of a random-init Llama pair (defaults: those of the embedded tiny pair)."""

    target_layers: int = 6  # decoder layers of the target
    draft_layers: int = 1  # decoder layers of the draft (the target's first ones)
    width: int = 384  # hidden size of both models
    vocab: int = 4096  # shared vocabulary
    deep_layer_scale: float = 0.05  # scale of the target's deeper layers' output weights
    init_range: float = 0.2  # std of the random init (wide: no near-ties between logits)
    positions: int = 2048  # context length
    seed: int = 0  # seeds the random weights

    def __post_init__(self) -> None:
        for name in ("target_layers", "draft_layers", "width", "vocab", "positions"):
            value = getattr(self, name)
            check_integer(name, value, minimum=1)
        if self.draft_layers > self.target_layers:
            raise ValueError(f"draft_layers ({self.draft_layers}) must be <= target_layers ({self.target_layers})")
        if self.width % 32:
            raise ValueError(f"width must be a multiple of 32 (heads of 32 or 64 dims), got {self.width}")


# Named shapes for `python -m specdec_ref.bench --random-shape NAME`. "gpt2-xl": the target
# has GPT-2 XL's depth, width, vocabulary and context (48 x 1600, 25 heads of 64, 50257
# tokens, 1024 positions; SwiGLU, so about 1.76B parameters against 1.56B). The draft is
# a truncated copy, so it keeps the target's width; it has GPT-2 small's depth (12
# layers), which sets a batch-1 pass's cost on a GPU, where each layer's kernel launches
# dominate (specdec_ref/data/size-sweep-cuda.json, H200: 12 x 768 takes 8.1 ms a pass, 48 x 1600
# 30 ms), so c is near gpt2 / gpt2-xl's; it has about 4x GPT-2 small's parameters.
RANDOM_SHAPES = {
    "tiny": RandomPairShape(),
    "gpt2-xl": RandomPairShape(target_layers=48, draft_layers=12, width=1600, vocab=50257, positions=1024),
}


@dataclass
class BenchPair:
    """A draft/target pair ready to benchmark."""

    target_model: PreTrainedModel  # the large model
    draft_model: PreTrainedModel  # the small model, same vocabulary and device
    tokenizer: object | None  # the shared tokenizer (None for a random pair)
    name: str  # "tiny", "random", ...: the pair actually used
    description: str  # one line for the report

    @property
    def device(self) -> torch.device:
        return next(self.target_model.parameters()).device


def random_pair(shape: RandomPairShape = RandomPairShape(), *, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32) -> BenchPair:
    """Random-init Llama target and its truncated copy as the draft (see the module docstring)."""
    heads = max(1, shape.width // 64)

    def config(layers: int) -> LlamaConfig:
        return LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.width, intermediate_size=3 * shape.width,
                           num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=heads,
                           max_position_embeddings=shape.positions, initializer_range=shape.init_range,
                           bos_token_id=0, eos_token_id=None, pad_token_id=0)

    torch.manual_seed(shape.seed)
    target = LlamaForCausalLM(config(shape.target_layers))
    with torch.no_grad():
        for layer in target.model.layers[shape.draft_layers:]:
            layer.self_attn.o_proj.weight.mul_(shape.deep_layer_scale)
            layer.mlp.down_proj.weight.mul_(shape.deep_layer_scale)
    draft = LlamaForCausalLM(config(shape.draft_layers))
    # The draft keeps the target's embeddings, first layers, final norm and head.
    draft.load_state_dict(target.state_dict(), strict=False)
    description = (f"random-init Llama pair: target {shape.target_layers} layers x {shape.width}, draft "
                   f"{shape.draft_layers} layer(s) (the target's first, same embeddings and head), vocab "
                   f"{shape.vocab}, deeper target layers scaled by {shape.deep_layer_scale}")
    pair = BenchPair(target.to(device, dtype), draft.to(device, dtype), None, "random", description)
    return _prepared(pair)


def load_bench_pair(name: str = "tiny", *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                    shape: RandomPairShape = RandomPairShape()) -> BenchPair:
    """The pair called `name` ("random", or a name `specdec_ref.models.load_pair` knows).

    Args:
        name: "random" builds `random_pair(shape)`; anything else goes to `load_pair`.
        device, dtype: where and in which precision the models run.
        shape: the shapes of a random pair.

    Returns:
        A `BenchPair` with EOS disabled in both models' generation configs.
    """
    if name == "random":
        return random_pair(shape, device=device, dtype=dtype)
    if name in PAIRS and PAIRS[name].cross:
        raise ValueError(f"pair {name!r} has a draft with a tokenizer of its own; these arms need one shared "
                         "tokenizer: benchmark it with python -m specdec_ref.bench.vocab")
    loaded = load_pair(name, device=device, dtype=dtype)
    draft, target, tokenizer = loaded.draft_model, loaded.target_model, loaded.tokenizer
    sizes = f"{_count(target) / 1e6:.1f}M and {_count(draft) / 1e6:.1f}M parameters"
    return _prepared(BenchPair(target.eval(), draft.eval(), tokenizer, name, f"the {name} pair ({sizes})"))


def _count(model: PreTrainedModel) -> int:
    return sum(parameter.numel() for parameter in model.parameters())


def no_eos(*models: PreTrainedModel) -> None:
    """Switch off EOS (fair token counts: every arm produces max_new_tokens) and set a pad
    id so `generate` does not warn."""
    for model in models:
        model.generation_config.eos_token_id = None
        if model.generation_config.pad_token_id is None:
            model.generation_config.pad_token_id = 0


def _prepared(pair: BenchPair) -> BenchPair:
    """Eval mode and no EOS for both models (`no_eos`)."""
    for model in (pair.target_model, pair.draft_model):
        model.eval()
    no_eos(pair.target_model, pair.draft_model)
    return pair


def bench_prompts(pair: BenchPair, num_prompts: int, *, prompt_tokens: int = 32,
                  seed: int = 0) -> tuple[list[torch.Tensor], str]:
    """A fixed prompt set for `pair`, each of shape (1, n) on the pair's device, and where it came from.

    Held-out corpus prompts when the pair has a tokenizer and `specdec_ref.training.corpus` exists,
    else the fixed `FALLBACK_PROMPTS` (tokenized), else random token ids (random pairs).
    """
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts!r}")
    if pair.tokenizer is None:
        generator = torch.Generator().manual_seed(seed)
        vocab = vocab_size(pair.target_model)
        lengths = torch.randint(prompt_tokens // 2, prompt_tokens + 1, (num_prompts,), generator=generator)
        prompts = [torch.randint(1, vocab, (1, int(n)), generator=generator) for n in lengths]  # (1, n) each
        source = "random token ids"
    else:
        try:
            corpus = importlib.import_module("..training.corpus", __package__)
            prompts = corpus.held_out_prompts(pair.tokenizer, num_prompts=num_prompts,
                                              prompt_tokens=prompt_tokens, seed=seed)
            source = "specdec_ref.training.corpus held-out prompts"
        except (ImportError, AttributeError):
            texts = [FALLBACK_PROMPTS[i % len(FALLBACK_PROMPTS)] for i in range(num_prompts)]
            prompts = [pair.tokenizer(text, return_tensors="pt")["input_ids"][:, :prompt_tokens] for text in texts]
            source = "fixed prompt list (specdec_ref.training.corpus unavailable)"
    return [prompt.to(pair.device) for prompt in prompts], source


@dataclass(frozen=True)
class PassCosts:
    """Measured relative costs of the pair's cached forward passes."""

    cost_ratio: float  # c: draft 1-token pass / target 1-token pass
    verify_cost: dict[int, float]  # v(K): target pass over K + 1 tokens / target 1-token pass
    target_seconds: float  # median time of one target 1-token pass
    context: int  # tokens already in the cache when timed
    lean_cost_ratio: float | None = None  # c with the draft run by `lean.LeanForward` (None: unsupported)
    loop_cost_ratio: float | None = None  # c of draft passes timed right after a target pass, as in the loop
    lean_loop_cost_ratio: float | None = None  # the same with the lean draft


def measure_costs(pair: BenchPair, *, context: int, max_k: int = 8, repeats: int = 20,
                  warmup: int = 3) -> PassCosts:
    """Time 1-token and (K + 1)-token cached passes at a cache of `context` tokens.

    Args:
        pair: the models to time.
        context: tokens in the KV cache before the timed pass (>= 1).
        max_k: v(K) is measured for K = 1..max_k.
        repeats, warmup: passed to `measure.measure_pass_latency` for each measurement.

    Returns:
        `PassCosts` with medians of `repeats` timings each.
    """
    if context < 1 or max_k < 1:
        raise ValueError(f"context and max_k must be >= 1, got {context!r} and {max_k!r}")
    limit = context_length(pair.target_model)
    if limit is not None:
        context = min(context, limit - max_k - 1)

    def pass_seconds(model: PreTrainedModel, num_tokens: int) -> float:
        curve = measure_pass_latency(model, context=context, num_tokens=(num_tokens,), repeats=repeats, warmup=warmup)
        return curve.median_s[0]

    # Each ratio divides two timings taken back to back, so a slow drift of a shared
    # machine affects both about equally.
    target_one = pass_seconds(pair.target_model, 1)
    cost_ratio = pass_seconds(pair.draft_model, 1) / target_one
    verify_cost = {}
    for k in range(1, max_k + 1):
        one = pass_seconds(pair.target_model, 1)
        verify_cost[k] = pass_seconds(pair.target_model, k + 1) / one
    lean_ratio = lean_loop = None
    loop = loop_draft_seconds(pair, CachedForward(pair.draft_model), context, repeats=repeats,
                              warmup=warmup) / pass_seconds(pair.target_model, 1)
    if lean_unsupported(pair.draft_model) is None:
        lean_ratio = lean_pass_seconds(pair.draft_model, context, repeats, warmup) / pass_seconds(pair.target_model, 1)
        lean = LeanForward(pair.draft_model, max_length=context + 8)
        lean_loop = loop_draft_seconds(pair, lean, context, repeats=repeats,
                                       warmup=warmup) / pass_seconds(pair.target_model, 1)
    return PassCosts(cost_ratio, verify_cost, target_one, context, lean_ratio, loop, lean_loop)


def loop_draft_seconds(pair: BenchPair, draft: LogitsSource, context: int, *, k: int = 4, repeats: int = 20,
                       warmup: int = 3) -> float:
    """Median time of a draft 1-token pass as the decoder runs it.

    Each repetition runs the target over k + 1 tokens (untimed), then times k
    consecutive 1-token passes of `draft` (a `CachedForward` or `LeanForward` of the
    pair's draft) and keeps their mean: the first pass after the target's finds the
    draft's weights evicted from the CPU's caches, the later ones less so.
    """
    device = pair.device
    generator = torch.Generator().manual_seed(0)
    sequence = torch.randint(0, vocab_size(pair.target_model), (1, context + k + 1),
                             generator=generator).to(device)  # (1, context + k + 1)
    target = CachedForward(pair.target_model)
    target.last_logits(sequence[:, :context], 1)  # fill both caches
    draft.last_logits(sequence[:, :context], 1)
    samples = []
    for repeat in range(warmup + repeats):
        target.last_logits(sequence, k + 1)
        target.rollback(context)
        synchronize(device)
        start = time.perf_counter()
        for i in range(1, k + 1):
            draft.last_logits(sequence[:, :context + i], 1)  # (1, V)
        synchronize(device)
        if repeat >= warmup:
            samples.append((time.perf_counter() - start) / k)
        draft.rollback(context)
    return Timing(tuple(samples)).median
