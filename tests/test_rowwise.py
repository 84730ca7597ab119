"""Row-by-row attention: each row of a pass over several tokens is bitwise a one-token step's."""

import copy

import pytest
import torch
from conftest import make_model

from specdec_ref import SamplingConfig, speculative_generate
from specdec_ref.kv_cache import CachedForward
from specdec_ref.packed import pack_linear_layers, packing_unsupported
from specdec_ref.rowwise import ROWWISE, rowwise_attention, use_rowwise_attention

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


@pytest.mark.skipif(not CAN_PACK, reason="this torch build cannot prepack linear layers")
@pytest.mark.parametrize("attention", [ROWWISE, "eager"])
def test_bfloat16_prepacked_passes_are_batch_invariant(attention):
    """bfloat16, prepacked layers, row-by-row or eager attention (the benchmark's bfloat16
    setting): a 6-token pass gives bitwise the logits of 6 one-token passes, so greedy cannot
    flip at a near-tie."""
    model = make_model("llama", layers=2, seed=5).to(torch.bfloat16)
    pack_linear_layers(model)
    if attention == ROWWISE:
        assert use_rowwise_attention(model) is model
    else:
        model.set_attn_implementation(attention)
    assert model.config._attn_implementation == attention
    alone, together = one_by_one_and_together(model)
    assert torch.equal(together, alone)


def test_rowwise_computes_what_sdpa_computes():
    """float32, plain layers: the same logits as sdpa attention (1e-5), pass after pass."""
    model = make_model("llama", layers=2, seed=6)
    reference = copy.deepcopy(model)
    use_rowwise_attention(model)
    sequence = torch.randint(2, 48, (1, 30), generator=torch.Generator().manual_seed(2))
    ours, theirs = CachedForward(model), CachedForward(reference)
    for end, m in [(12, 12), (13, 1), (18, 5), (24, 6)]:
        assert torch.allclose(ours.last_logits(sequence[:, :end], m), theirs.last_logits(sequence[:, :end], m),
                              atol=1e-5, rtol=0)


def test_greedy_with_rowwise_attention_is_generates():
    """Speculative greedy on a row-by-row target: generate's tokens on the same model."""
    target, draft = make_model("llama", layers=3, seed=1), make_model("llama", layers=1, seed=2)
    use_rowwise_attention(target)
    prompt = torch.tensor([[3, 9, 4, 1, 5]])
    expected = target.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False)
    out = speculative_generate(target, draft, prompt, max_new_tokens=40, num_draft_tokens=4, sampling=GREEDY)
    assert torch.equal(out.sequences, expected)


def test_batches_and_masks_fall_back_or_follow_the_mask():
    """Two sequences: plain sdpa attention; a mask that blocks a key: that row keeps its mask."""
    model = make_model("llama", layers=1, seed=7)
    attention = model.model.layers[0].self_attn
    generator = torch.Generator().manual_seed(3)
    query = torch.randn(2, 4, 3, 16, generator=generator)
    key, value = torch.randn(2, 2, 5, 16, generator=generator), torch.randn(2, 2, 5, 16, generator=generator)
    batched, _ = rowwise_attention(attention, query, key, value, None, scaling=0.25, is_causal=True)
    assert batched.shape == (2, 3, 4, 16)
    mask = torch.ones(1, 1, 3, 5, dtype=torch.bool).tril(2)  # causal for rows at positions 2, 3, 4
    mask[..., 2, 0] = False  # the last row may not see key 0
    out, _ = rowwise_attention(attention, query[:1], key[:1], value[:1], mask, scaling=0.25)
    keys = key[:1, :, :, :].repeat_interleave(2, dim=1)
    values = value[:1].repeat_interleave(2, dim=1)
    for i in range(3):
        allowed = mask[0, 0, i, : 3 + i]
        scores = torch.einsum("hd,hkd->hk", query[0, :, i], keys[0, :, : 3 + i]) * 0.25  # (H, 3 + i)
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        expected = torch.einsum("hk,hkd->hd", weights, values[0, :, : 3 + i])  # (H, d)
        assert torch.allclose(out[0, i], expected, atol=1e-5)


def test_a_model_without_an_attention_switch_is_refused():
    """The error names what is missing."""
    with pytest.raises(ValueError, match="set_attn_implementation"):
        use_rowwise_attention(torch.nn.Linear(2, 2))
