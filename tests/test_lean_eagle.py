"""`fast.lean_eagle`: EAGLE's head run lean gives the same features, drafts and output."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model

from specdec_ref import SamplingConfig, speculative_generate
from specdec_ref.fast.lean_eagle import LeanEagle
from specdec_ref.heads.drafters import EagleDrafter
from specdec_ref.heads.eagle import EagleHead
from specdec_ref.heads.features import FeatureSource

GREEDY = SamplingConfig(temperature=0.0)


def llama_and_head(seed: int = 0):
    target = make_model("llama", layers=2, width=64, vocab=96, seed=seed, init_range=0.3)
    torch.manual_seed(seed + 1)
    return target, EagleHead.for_target(target).eval()


@torch.no_grad()
def test_same_features_through_passes_and_crops():
    """A 6-row pass, single rows, a crop of 2, single rows again: the lean head's predicted
    features equal the head's own (DynamicCache) within 1e-5, every pass."""
    _, head = llama_and_head()
    lean = LeanEagle(head)
    plain_cache, lean_cache = head.new_cache(), lean.new_cache()
    gen = torch.Generator().manual_seed(3)
    hidden = head.config.hidden_size

    def check(start: int, m: int) -> None:
        embeds = torch.randn(1, m, hidden, generator=gen)
        feats = torch.randn(1, m, hidden, generator=gen)
        positions = torch.arange(start, start + m)[None]
        expected = head(embeds, feats, positions, plain_cache)
        got = lean(embeds, feats, positions, lean_cache)
        assert got.shape == expected.shape == (1, m, hidden)
        assert (got - expected).abs().max() < 1e-5

    check(0, 6)
    check(6, 1)
    check(7, 1)
    plain_cache.crop(-2)
    lean_cache.crop(-2)
    assert lean_cache.get_seq_length() == plain_cache.get_seq_length() == 6
    check(6, 3)
    check(9, 1)


def test_drafter_with_lean_head_is_exact_and_drafts_the_same_q():
    """Greedy: the target's own tokens; sampled: the same q as the plain head's drafter."""
    target, head = llama_and_head(seed=2)
    prompt = torch.tensor([[5, 17, 33, 2, 9]])
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=24,
                               do_sample=False)
    source = FeatureSource(target)
    out = speculative_generate(source, EagleDrafter(LeanEagle(head), source), prompt, max_new_tokens=24,
                               num_draft_tokens=4, sampling=GREEDY)
    assert torch.equal(out.sequences, expected)
    assert out.stats.drafted_tokens > 0
    warm = SamplingConfig(temperature=0.7)
    drafts = []
    for made in (head, LeanEagle(head)):
        source = FeatureSource(target)
        drafter = EagleDrafter(made, source, sampling=warm, generator=torch.Generator().manual_seed(0))
        source.last_logits(prompt[:, :-1], 1)
        drafts.append(drafter.draft(prompt, 3, 96))
    assert torch.equal(drafts[0].tokens, drafts[1].tokens)
    assert (drafts[0].probs - drafts[1].probs).abs().max() < 1e-5


def test_refusals_name_the_problem():
    _, head = llama_and_head()
    lean = LeanEagle(head, max_length=8)
    cache = lean.new_cache()
    x = torch.zeros(1, 2, head.config.hidden_size)
    with pytest.raises(TypeError, match="EagleHead"):
        LeanEagle(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="tree"):
        lean(x, x, torch.tensor([[0, 1]]), cache, allowed=torch.ones(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="continue the cache"):
        lean(x, x, torch.tensor([[3, 4]]), cache)
    lean(x, x, torch.tensor([[0, 1]]), cache)
    with pytest.raises(ValueError, match="max_length"):
        lean(torch.zeros(1, 7, head.config.hidden_size), torch.zeros(1, 7, head.config.hidden_size),
             torch.arange(2, 9)[None], cache)
