"""Tiny random-init models from configs (GPT-2 and Llama families); no hub, no network."""

from __future__ import annotations

import copy
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NamedTuple

import pytest
import torch
from scipy.stats import chisquare
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from specdec_ref.fast.packed import packing_unsupported
from specdec_ref.sampling import logits_to_probs

VOCAB = 48

# Prepacked bfloat16 needs AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; on a CPU without them
# (AVX2 only) oneDNN refuses it, and `fast.prepare` keeps such a pair in float32. Tests of
# prepacked bfloat16 are skipped there, with oneDNN's reason.
BF16_PACKING = packing_unsupported(torch.nn.Linear(2, 2).to(torch.bfloat16))
needs_bf16_packing = pytest.mark.skipif(BF16_PACKING is not None, reason=str(BF16_PACKING))

# Tiny models gain nothing from intra-op threads, and spinning OpenMP threads slow
# everything down badly when another process holds a core: one thread is faster here.
torch.set_num_threads(1)


@contextmanager
def torch_threads(count: int | None = None) -> Iterator[None]:
    """Run a block with `count` torch threads (None: as they are) and restore the count after:
    the thread count (and every `--threads` option) is process-wide, other tests must not see it."""
    before = torch.get_num_threads()
    if count is not None:
        torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)

# The devices the exactness, greedy-equality and rollback tests run on: the CPU always,
# and CUDA where a GPU is present (scripts/gpu_check.sh runs them there).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> str:
    """Each device of DEVICES in turn ("cpu", and "cuda" where a GPU is present)."""
    return request.param


# The paths the decoder's exactness tests run through: the models themselves (the
# teaching and cached path), the fast path's static cache (`fast.StaticForward`,
# attending over the whole buffer through a mask as a CUDA graph does; on CUDA it
# captures and replays the graphs), and the default path `fast.prepare` sets up for
# the device (on a CPU: bfloat16 where native, prepacked, grouped attention, a lean
# Llama draft; on CUDA: StaticForward with graphs), on copies of the models.
PATHS = ["models", "static", "prepared"]


@pytest.fixture(params=PATHS)
def path(request) -> str:
    """Each path of PATHS in turn ("models", "static", "prepared")."""
    return request.param


class Route(NamedTuple):
    """What a test passes to the decoder on one path, and the model it must match."""

    target: object  # speculative_generate's target_model
    draft: object  # its draft_model (None: target only)
    target_model: object  # the target as the path runs it: its generate and law are the reference


def through(path: str, target, draft=None, *, max_length: int, sampling=None, generator=None) -> Route:
    """The arguments of `speculative_generate` for `path` (draft None: target only).

    "static" wraps the target in a `StaticForward` and the draft in a `ModelDrafter` over
    one, which then needs the call's `sampling` and `generator`; "prepared" runs
    `fast.prepare` on copies (it changes models in place), so the reference output must
    come from `Route.target_model`, the prepared target."""
    from specdec_ref.drafting import ModelDrafter
    from specdec_ref.fast import StaticForward, prepare

    if path == "models":
        return Route(target, draft, target)
    if path == "prepared":
        fast = prepare(copy.deepcopy(draft if draft is not None else target), copy.deepcopy(target),
                       max_length=max_length)
        return Route(fast.target, fast.draft if draft is not None else None, fast.target_model)
    static_target = StaticForward(target, max_length=max_length, static_shapes=True)
    if draft is None:
        return Route(static_target, None, target)
    static_draft = StaticForward(draft, max_length=max_length, static_shapes=True)
    return Route(static_target, ModelDrafter(static_draft, sampling, generator), target)


def generator_on(device: str, seed: int) -> torch.Generator:
    """A seeded generator on `device`: `sampling.sample` and `rejection.accept_reject`
    draw on the generator's device, so on "cuda" the draws are made on the GPU."""
    return torch.Generator(device=device).manual_seed(seed)


def make_model(family: str, *, layers: int = 2, width: int = 64, vocab: int = VOCAB, seed: int = 0,
               positions: int = 512, init_range: float = 0.2):
    """A small random-init causal LM in float32, eval mode, with EOS disabled in generate.

    A wide init range spreads the logits so greedy argmax ties (which float rounding
    could flip between a one-pass and an incremental computation) do not occur.
    """
    torch.manual_seed(seed)
    if family == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=width, n_layer=layers, n_head=4,
                            bos_token_id=0, eos_token_id=1, initializer_range=init_range)
        model = GPT2LMHeadModel(config)
    elif family == "llama":
        config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=2 * width,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=positions, bos_token_id=0, eos_token_id=1,
                             pad_token_id=None, initializer_range=init_range)
        model = LlamaForCausalLM(config)
    else:
        raise ValueError(family)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.fixture(params=["gpt2", "llama"])
def pair(request):
    """(target, draft) of one family: the draft shares the vocabulary, has fewer layers."""
    family = request.param
    return make_model(family, layers=3, seed=1), make_model(family, layers=1, seed=2)


def noisy_copy(model, noise: float, seed: int = 0):
    """A draft that agrees with `model` often but not always: its weights plus noise."""
    import copy

    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in draft.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * noise * param.std().clamp(min=1e-3))
    return draft.eval()


@pytest.fixture(params=["gpt2", "llama"])
def close_pair(request):
    """(target, draft) where the draft is a noisy copy: acceptance is neither 0 nor 1."""
    target = make_model(request.param, layers=2, seed=1)
    return target, noisy_copy(target, noise=0.3, seed=3)


def exact_joint_law(model, prompt, sampling, length, vocab):
    """P(x_1 .. x_length | prompt) for every continuation, by enumeration, in one batch.

    `prompt` holds token ids, shape (n,) or (1, n)."""
    prompt = prompt.reshape(1, -1)  # (1, n)
    continuations = torch.tensor(list(itertools.product(range(vocab), repeat=length)))  # (V^L, L)
    sequences = torch.cat([prompt.expand(len(continuations), -1), continuations], dim=1)
    with torch.no_grad():
        logits = model(sequences).logits[:, prompt.size(1) - 1:-1]  # (V^L, L, V)
    probs = logits_to_probs(logits, sampling).double()  # (V^L, L, V)
    mass = probs.gather(-1, continuations[..., None]).squeeze(-1).prod(-1)  # (V^L,)
    return dict(zip(map(tuple, continuations.tolist()), mass.tolist(), strict=True))


def chi_square_pvalue(law, samples):
    """p-value of sampled continuations against an exact law (cells expected < 5 pooled);
    0 if any sample has zero probability under the law."""
    n = len(samples)
    if any(law.get(s, 0) == 0 for s in samples):
        return 0.0  # a continuation the target gives no mass at all
    counts = {t: 0 for t in law}
    for s in samples:
        counts[s] += 1
    common = [t for t in law if law[t] * n >= 5]
    observed = [counts[t] for t in common] + [n - sum(counts[t] for t in common)]
    expected = [law[t] * n for t in common] + [n * (1 - sum(law[t] for t in common))]
    if expected[-1] < 1e-9:
        observed, expected = observed[:-1], expected[:-1]
    return chisquare(observed, expected, sum_check=False).pvalue
