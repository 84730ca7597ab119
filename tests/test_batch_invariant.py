"""Batch-invariant attention (row by row, grouped eager): each row of a pass over several tokens
is bitwise a one-token step's."""

import copy

import pytest
import torch
from conftest import make_model, needs_bf16_packing, torch_threads

from specdec_ref import SamplingConfig, speculative_generate
from specdec_ref.fast.batch_invariant import (
    GROUPED,
    ROWWISE,
    grouped_attention,
    rowwise_attention,
    use_rowwise_attention,
)
from specdec_ref.fast.packed import pack_linear_layers, packing_unsupported
from specdec_ref.kv_cache import CachedForward

GREEDY = SamplingConfig(temperature=0.0)
CAN_PACK = packing_unsupported(torch.nn.Linear(2, 2)) is None


def one_by_one_and_together(model, rows: int = 6):
    """Logits of `rows` one-token passes and of one pass over the same `rows` tokens."""
    sequence = torch.randint(2, 48, (1, 40), generator=torch.Generator().manual_seed(1))
    source = CachedForward(model)
    source.last_logits(sequence[:, :30], 1)
    alone = torch.cat([source.last_logits(sequence[:, :31 + i], 1) for i in range(rows)])  # (rows, V)
    source.rollback(30)
    return alone, source.last_logits(sequence[:, :30 + rows], rows)


@needs_bf16_packing
@pytest.mark.skipif(not CAN_PACK, reason="this torch build cannot prepack linear layers")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("rows", [2, 6])
@pytest.mark.parametrize("attention", [ROWWISE, GROUPED, "eager"])
def test_bfloat16_prepacked_passes_are_batch_invariant(attention, rows, threads):
    """bfloat16, prepacked layers, row-by-row, grouped eager (the benchmark's bfloat16 setting)
    or eager attention, on one thread or two (the committed benchmark's): a pass over several
    tokens gives bitwise the logits of as many one-token passes, so greedy cannot flip at a
    near-tie."""
    with torch_threads(threads):
        assert_batch_invariant(attention, rows)


def assert_batch_invariant(attention: str, rows: int) -> None:
    """A small bfloat16 Llama, prepacked, with `attention`: `rows` tokens in one pass equal
    `rows` one-token passes, bitwise."""
    model = make_model("llama", layers=2, seed=5).to(torch.bfloat16)
    pack_linear_layers(model)
    if attention in (ROWWISE, GROUPED):
        assert use_rowwise_attention(model, attention) is model
    else:
        model.set_attn_implementation(attention)
    assert model.config._attn_implementation == attention
    alone, together = one_by_one_and_together(model, rows)
    assert torch.equal(together, alone)


@pytest.mark.parametrize("attention", [ROWWISE, GROUPED])
def test_rowwise_and_grouped_compute_what_sdpa_computes(attention):
    """float32, plain layers: the same logits as sdpa attention (1e-5), pass after pass."""
    model = make_model("llama", layers=2, seed=6)
    reference = copy.deepcopy(model)
    use_rowwise_attention(model, attention)
    sequence = torch.randint(2, 48, (1, 30), generator=torch.Generator().manual_seed(2))
    ours, theirs = CachedForward(model), CachedForward(reference)
    for end, m in [(12, 12), (13, 1), (18, 5), (24, 6)]:
        assert torch.allclose(ours.last_logits(sequence[:, :end], m), theirs.last_logits(sequence[:, :end], m),
                              atol=1e-5, rtol=0)


@pytest.mark.parametrize("attention", [ROWWISE, GROUPED])
def test_greedy_with_rowwise_or_grouped_attention_is_generates(attention):
    """Speculative greedy on such a target: generate's tokens on the same model."""
    target, draft = make_model("llama", layers=3, seed=1), make_model("llama", layers=1, seed=2)
    use_rowwise_attention(target, attention)
    prompt = torch.tensor([[3, 9, 4, 1, 5]])
    expected = target.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False)
    out = speculative_generate(target, draft, prompt, max_new_tokens=40, num_draft_tokens=4, sampling=GREEDY)
    assert torch.equal(out.sequences, expected)


@pytest.mark.parametrize("attention", [rowwise_attention, grouped_attention])
def test_batches_and_masks_fall_back_or_follow_the_mask(attention):
    """Two sequences: plain sdpa attention; a mask that blocks a key: that row keeps its mask."""
    model = make_model("llama", layers=1, seed=7)
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(2, 4, 3, 16, generator=generator)
    key, value = torch.randn(2, 2, 5, 16, generator=generator), torch.randn(2, 2, 5, 16, generator=generator)
    layer = model.model.layers[0].self_attn
    batched, _ = attention(layer, query, key, value, None, scaling=0.25, is_causal=True)
    assert batched.shape == (2, 3, 4, 16)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool).tril(2)  # causal for rows at positions 2, 3, 4
    mask[..., 2, 0] = False  # the last row may not see key 0
    out, _ = attention(layer, query[:1], key[:1], value[:1], mask, scaling=0.25)
    keys = key[:1, :, :, :].repeat_interleave(2, dim=1)
    values = value[:1].repeat_interleave(2, dim=1)
    for i in range(3):
        allowed = mask[0, 0, i, : 3 + i]
        scores = torch.einsum("hd,hkd->hk", query[0, :, i], keys[0, :, : 3 + i]) * 0.25  # (H, 3 + i)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        expected = torch.einsum("hk,hkd->hd", weights, values[0, :, : 3 + i])  # (H, d)
        assert torch.allclose(out[0, i], expected, atol=1e-5)


@pytest.mark.parametrize("attention", [ROWWISE, GROUPED])
def test_a_padded_batch_brings_its_mask(attention):
    """Two left-padded prompts through `generate`: the padding mask reaches the attention
    (both are registered with transformers' sdpa mask), so the tokens are sdpa's."""
    model = make_model("llama", layers=2, seed=8)
    reference = copy.deepcopy(model)
    use_rowwise_attention(model, attention)
    prompts = torch.tensor([[0, 0, 0, 7, 3, 9], [4, 8, 1, 5, 2, 6]])
    mask = (torch.arange(6) >= torch.tensor([[3], [0]])).long()  # the first prompt is padded
    kwargs = {"attention_mask": mask, "max_new_tokens": 8, "min_new_tokens": 8, "do_sample": False,
              "pad_token_id": 0}
    assert torch.equal(model.generate(prompts, **kwargs), reference.generate(prompts, **kwargs))


def test_a_model_without_an_attention_switch_or_an_unknown_attention_is_refused():
    """The errors name what is missing or allowed."""
    with pytest.raises(ValueError, match="set_attn_implementation"):
        use_rowwise_attention(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="attention must be"):
        use_rowwise_attention(make_model("llama", layers=1, seed=1), "flash")


@pytest.mark.parametrize("attention", [ROWWISE, GROUPED])
def test_a_window_longer_than_the_sequence_keeps_the_batch_invariant_path(attention, monkeypatch):
    """Mistral with sliding_window 4096 over 20 tokens: the window hides nothing, so no call
    falls back to sdpa; a window of 6 does hide keys: sdpa (with the window's mask) and a
    warning that says so. Either way the tokens are sdpa's."""
    from transformers import MistralConfig, MistralForCausalLM

    from specdec_ref.fast import batch_invariant as rowwise

    calls = []
    fallback = rowwise.sdpa_attention_forward
    monkeypatch.setattr(rowwise, "sdpa_attention_forward", lambda *a, **k: calls.append(1) or fallback(*a, **k))
    prompt = torch.tensor([[3, 9, 4, 1, 5, 7, 2, 8]])
    kwargs = {"max_new_tokens": 12, "min_new_tokens": 12, "do_sample": False}
    for window in (4096, 6):
        torch.manual_seed(0)
        config = MistralConfig(vocab_size=48, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                               sliding_window=window, initializer_range=0.2, pad_token_id=0)
        model = MistralForCausalLM(config).eval()
        expected = copy.deepcopy(model).generate(prompt, **kwargs)
        use_rowwise_attention(model, attention)
        calls.clear()
        if window > 20:
            assert torch.equal(model.generate(prompt, **kwargs), expected)
            assert not calls
        else:
            with pytest.warns(UserWarning, match="sliding_window=6 .* falls back to sdpa"):
                assert torch.equal(model.generate(prompt, **kwargs), expected)
            assert calls
