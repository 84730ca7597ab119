"""A reduced draft vocabulary (EAGLE-3's): q is zero outside it, and the decoder stays exact."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model

from specdec_ref import SamplingConfig, speculative_generate
from specdec_ref.heads.draft_vocab import ReducedParts, load_draft_vocab
from specdec_ref.heads.drafters import EagleDrafter
from specdec_ref.heads.eagle import EagleHead
from specdec_ref.heads.features import FeatureSource
from specdec_ref.heads.law import head_law
from specdec_ref.laws import law_tv, target_law
from specdec_ref.models import TINY_DIR
from specdec_ref.training.draft_vocab import choose

GREEDY = SamplingConfig(temperature=0.0)


def eagle(model, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    return EagleHead.for_target(model).eval()


def test_reduced_logits_are_the_full_ones_on_the_kept_rows():
    model = make_model("llama", seed=31)
    parts = FeatureSource(model).parts
    ids = torch.tensor([7, 2, 40, 11])
    reduced = ReducedParts(parts, ids)
    hidden = torch.randn(3, model.config.hidden_size)
    full, small = parts.logits(hidden), reduced.logits(hidden)
    assert torch.allclose(small[:, ids], full[:, ids], atol=1e-5)
    outside = torch.ones(full.size(-1), dtype=torch.bool)
    outside[ids] = False
    assert torch.isinf(small[:, outside]).all() and (small[:, outside] < 0).all()


def test_greedy_with_a_reduced_vocabulary_is_the_targets_greedy():
    """Drafts confined to 8 of 48 tokens: rejected where the target picks another, still the
    target's own output token for token."""
    model = make_model("llama", seed=32)
    source = FeatureSource(model)
    prompt = torch.tensor([[3, 9, 27, 4]])
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30,
                              **GREEDY.generate_kwargs())
    drafter = EagleDrafter(eagle(model), source, 3, parts=ReducedParts(source.parts, torch.arange(8)))
    out = speculative_generate(source, drafter, prompt, max_new_tokens=30, num_draft_tokens=3, sampling=GREEDY)
    assert torch.equal(out.sequences, expected)
    drafted = [t for record in out.trace for t in record.drafted]
    assert drafted and all(t < 8 for t in drafted)


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.9)])
def test_reduced_vocabulary_law_is_the_target_law(sampling):
    """By enumeration on a 5-token target, drafts over 2 of its tokens: the first 3 tokens follow
    the target's law to 1e-12, while the article's rule on the same drafts does not."""
    model = make_model("llama", layers=1, width=16, vocab=5, seed=8, init_range=0.6)
    prompt = torch.tensor([[1, 3]])
    source = FeatureSource(model)
    drafter = EagleDrafter(eagle(model, 2), source, parts=ReducedParts(source.parts, torch.tensor([4, 1])))
    expected = target_law(model, prompt, sampling, 3)
    law = head_law(drafter, prompt, num_draft_tokens=2, sampling=sampling, num_tokens=3)
    assert max(abs(law.get(o, 0.0) - expected.get(o, 0.0)) for o in set(law) | set(expected)) < 1e-12
    biased = head_law(drafter, prompt, num_draft_tokens=2, sampling=sampling, num_tokens=3, rule="article")
    assert law_tv(biased, expected) > 1e-3


def test_bad_ids_are_named():
    parts = FeatureSource(make_model("llama", seed=33)).parts
    for ids in (torch.tensor([], dtype=torch.long), torch.tensor([1, 1]), torch.tensor([48]), torch.tensor([-1])):
        with pytest.raises(ValueError, match="ids must be distinct token ids in"):
            ReducedParts(parts, ids)
    with pytest.raises(ValueError, match="size must be in"):
        load_draft_vocab(TINY_DIR / "eagle-head", 5000)


def test_choose_orders_by_frequency_and_reports_coverage():
    from collections import Counter

    ids, covered = choose(Counter({3: 5, 1: 5, 0: 2}), 300)
    assert ids[:4] == [1, 3, 0, 2] and sorted(ids) == list(range(300))
    assert covered == {"256": 1.0}


def test_the_shipped_draft_vocabulary_covers_the_tiny_vocabulary():
    ids = load_draft_vocab(TINY_DIR / "eagle-head")
    assert sorted(ids.tolist()) == list(range(4096))
