"""Prepacked linear layers change the speed of a pass, never what it computes."""

import copy
import os
import subprocess
import sys

import pytest
import torch
from conftest import chi_square_pvalue, exact_joint_law, make_model, needs_bf16_packing, noisy_copy, torch_threads

from specdec_ref import SamplingConfig, speculative_generate
from specdec_ref.bench.run import BenchConfig
from specdec_ref.drafting import ModelDrafter
from specdec_ref.fast.batch_invariant import use_rowwise_attention
from specdec_ref.fast.lean import LeanForward
from specdec_ref.fast.packed import (
    PackedLinear,
    WatchedParameter,
    is_packed,
    pack_linear_layers,
    packing_unsupported,
    repack,
    set_packing,
    unpack_linear_layers,
)
from specdec_ref.kv_cache import CachedForward
from specdec_ref.models import load_pair
from specdec_ref.training.corpus import held_out_prompts

GREEDY = SamplingConfig(temperature=0.0)
pytestmark = pytest.mark.skipif(packing_unsupported(torch.nn.Linear(2, 2)) is not None,
                                reason="this torch build cannot prepack linear layers")


def packed_copy(model):
    """A deep copy of `model` with its linear layers packed."""
    twin = copy.deepcopy(model)
    assert pack_linear_layers(twin) > 0
    return twin


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_logits_match_the_plain_model_across_passes_and_rollbacks(family):
    """Passes of 1 to 9 tokens, rollbacks: logits within 1e-5 of the unpacked model (float32)."""
    model = make_model(family, layers=2, seed=3)
    packed = packed_copy(model)
    assert is_packed(packed) and not is_packed(model)
    ours, theirs = CachedForward(packed), CachedForward(model)
    sequence = torch.randint(2, 48, (1, 60), generator=torch.Generator().manual_seed(0))
    # (length fed up to, positions asked for, rollback to afterwards)
    steps = [(12, 12, 12), (13, 1, 13), (18, 5, 14), (23, 9, 23), (24, 1, 20), (26, 6, 26)]
    for end, m, keep in steps:
        a, b = ours.last_logits(sequence[:, :end], m), theirs.last_logits(sequence[:, :end], m)
        assert a.shape == b.shape == (m, 48)
        assert torch.allclose(a, b, atol=1e-5, rtol=0)
        ours.rollback(keep)
        theirs.rollback(keep)


@pytest.mark.parametrize("k", [1, 3, 5, 7])
def test_greedy_with_packed_models_is_the_plain_targets_greedy(close_pair, k):
    """Packed target and draft (transformers or lean): the plain target's greedy tokens."""
    target, draft = close_pair
    prompt = torch.tensor([[3, 9, 4, 1, 5]])
    expected = target.generate(prompt, max_new_tokens=50, min_new_tokens=50, do_sample=False)
    fast_target, fast_draft = packed_copy(target), packed_copy(draft)
    assert torch.equal(fast_target.generate(prompt, max_new_tokens=50, min_new_tokens=50, do_sample=False),
                       expected)
    out = speculative_generate(fast_target, fast_draft, prompt, max_new_tokens=50, num_draft_tokens=k,
                               sampling=GREEDY)
    assert torch.equal(out.sequences, expected)
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # both branches ran
    if fast_draft.config.model_type == "llama":
        lean = ModelDrafter(LeanForward(fast_draft), GREEDY)
        out = speculative_generate(fast_target, lean, prompt, max_new_tokens=50, num_draft_tokens=k,
                                   sampling=GREEDY)
        assert torch.equal(out.sequences, expected)


@pytest.mark.slow
def test_sampling_with_packed_models_matches_the_target_law():
    """The joint law of 3 tokens from packed models equals the plain target's (chi-square)."""
    vocab, sampling = 5, SamplingConfig(1.0)
    target = make_model("llama", layers=1, width=32, vocab=vocab, seed=7, init_range=0.5)
    draft = noisy_copy(target, noise=0.8, seed=8)
    prompt = torch.tensor([[1, 2]])
    law = exact_joint_law(target, prompt, sampling, 3, vocab)  # the plain model's exact law
    fast_target, fast_draft = packed_copy(target), packed_copy(draft)
    generator = torch.Generator().manual_seed(123)
    samples, accepted = [], 0
    for _ in range(3000):
        out = speculative_generate(fast_target, fast_draft, prompt, max_new_tokens=3, num_draft_tokens=2,
                                   sampling=sampling, generator=generator)
        samples.append(tuple(out.sequences[0, 2:].tolist()))
        accepted += out.stats.accepted_tokens
    assert 0 < accepted < 3000 * 2  # acceptances and rejections both happened
    assert chi_square_pvalue(law, samples) > 1e-3


@pytest.mark.parametrize(("dtype", "attention", "threads"),
                         [(torch.float32, None, 1),
                          *(pytest.param(torch.bfloat16, attention, threads, marks=needs_bf16_packing)
                            for attention, threads in (("eager", 1), ("rowwise_sdpa", 1), ("grouped_eager", 1),
                                                       ("grouped_eager", 2)))])
def test_the_embedded_pair_in_the_benchmarks_settings_keeps_generates_tokens(dtype, attention, threads):
    """Tiny pair, prepacked, in float32 and in bfloat16 with a batch-invariant attention (grouped
    eager on two threads: the committed benchmark's setting), lean draft, K = 5: greedy output
    is `generate`'s on the same model, token for token."""
    with torch_threads(threads):
        assert_pair_greedy_is_generates(dtype, attention)


def assert_pair_greedy_is_generates(dtype: torch.dtype, attention: str | None) -> None:
    """The tiny pair so configured: speculative greedy == generate's greedy on two prompts."""
    draft_model, target_model, tokenizer = load_pair("tiny", device="cpu", dtype=dtype)
    for model in (target_model, draft_model):
        pack_linear_layers(model)
        if attention in ("rowwise_sdpa", "grouped_eager"):
            use_rowwise_attention(model, attention)
        elif attention is not None:
            model.set_attn_implementation(attention)
    for prompt in held_out_prompts(tokenizer, num_prompts=2, prompt_tokens=32):
        expected = target_model.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False,
                                         pad_token_id=0, eos_token_id=None)
        drafter = ModelDrafter(LeanForward(draft_model), GREEDY)
        out = speculative_generate(target_model, drafter, prompt, max_new_tokens=40, num_draft_tokens=5,
                                   sampling=GREEDY)
        assert torch.equal(out.sequences, expected)


def test_weights_stay_shared_saved_and_followed():
    """state_dict and tying unchanged; in-place edits, dtype changes and unpacking are followed."""
    model = make_model("llama", layers=1, seed=4)
    model.config.tie_word_embeddings = True
    model.tie_weights()
    keys = list(model.state_dict())
    layers = pack_linear_layers(model)
    assert layers == 8 and pack_linear_layers(model) == 0  # 4 attention + 3 MLP + head; none left
    assert list(model.state_dict()) == keys
    assert model.lm_head.weight is model.model.embed_tokens.weight
    ids = torch.tensor([[3, 4, 5, 6]])
    before = model(ids).logits
    with torch.no_grad():
        model.model.layers[0].mlp.up_proj.weight.mul_(2.0)  # an in-place edit: repacked
    after = model(ids).logits
    assert not torch.allclose(before, after, atol=1e-3)
    reference = copy.deepcopy(model)
    assert unpack_linear_layers(reference) == layers and not is_packed(reference)
    assert sum(type(m) is torch.nn.Linear for m in reference.modules()) == layers
    assert torch.allclose(after, reference(ids).logits, atol=1e-5, rtol=0)
    twin = copy.deepcopy(model)  # a copy packs its own weights on its first call
    assert torch.allclose(twin(ids).logits, after, atol=1e-5, rtol=0) and is_packed(twin)
    half = model.to(torch.bfloat16)  # a new dtype: repacked in that dtype
    assert half(ids).logits.dtype == torch.bfloat16
    model.float().train()  # gradients flow through the plain path
    model(ids, labels=ids).loss.backward()
    assert model.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0


def test_bad_arguments_are_refused_with_their_names():
    """rows, unsupported dtypes and the benchmark's linear setting: clear errors."""
    model = make_model("llama", layers=1)
    for rows in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="rows must be an integer >= 1"):
            pack_linear_layers(model, rows=rows)
    with pytest.raises(ValueError, match="float16"):
        pack_linear_layers(copy.deepcopy(model).half())
    assert "float16" in packing_unsupported(copy.deepcopy(model).half())
    with pytest.raises(ValueError, match="linear must be one of"):
        BenchConfig(linear="fast")
    layer = PackedLinear(torch.nn.Linear(4, 3), rows=8)
    assert "rows=8" in repr(layer)


@pytest.mark.parametrize(("given", "expected"), [(None, "16384"), ("77", "77")])
def test_importing_the_package_keeps_more_onednn_kernels_unless_told(given, expected):
    """`import specdec_ref` raises oneDNN's kernel cache (1,024 shapes by default, fewer than a
    speculative loop meets) before any kernel is compiled, and leaves a value the user set."""
    env = {k: v for k, v in os.environ.items() if k != "ONEDNN_PRIMITIVE_CACHE_CAPACITY"}
    if given is not None:
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = given
    code = "import os, specdec_ref; print(os.environ['ONEDNN_PRIMITIVE_CACHE_CAPACITY'])"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == expected


@torch.no_grad()  # the packed copy serves inference only
def test_writes_through_data_reach_the_packed_copy():
    """`weight.data.copy_(new)` (which bumps no version counter) is followed, even through a
    `.data` view kept and written later: logits as plain F.linear on the same weights."""
    model = make_model("llama", layers=1, seed=5)
    pack_linear_layers(model)
    ids = torch.tensor([[3, 4, 5, 6]])

    def assert_follows_the_weights() -> None:
        packed = model(ids).logits
        set_packing(model, False)
        plain = model(ids).logits
        set_packing(model, True)
        difference = float((packed - plain).abs().max())
        assert difference < 1e-5, f"packed logits off by {difference}: a stale packed copy"

    assert_follows_the_weights()
    new = torch.randn(model.lm_head.weight.shape, generator=torch.Generator().manual_seed(0))
    model.lm_head.weight.data.copy_(new)  # the idiom of many checkpoint loaders
    assert_follows_the_weights()
    view = model.model.layers[0].mlp.up_proj.weight.data
    assert_follows_the_weights()
    view.mul_(3.0)  # a `.data` view taken earlier, written now
    assert_follows_the_weights()
    assert type(model.lm_head.weight) is WatchedParameter
    model.lm_head.weight.detach().numpy()[:] *= 2.0  # no tensor sees this write: say so
    assert repack(model) == 8
    assert_follows_the_weights()
    unpack_linear_layers(model)
    assert type(model.lm_head.weight) is torch.nn.Parameter
