"""The tree model of speed (`tree_model`): it reduces to chapter 6's chain formula,
counts a tree's paths right, and reads its rates from a decoder's trace."""

import pytest
import torch
from conftest import make_model, noisy_copy

from specdec_ref.sampling import SamplingConfig
from specdec_ref.trees.model import (
    expected_accepted,
    expected_tokens,
    predicted_speedup,
    rank_probabilities,
    rank_rates,
    shape_parents,
    sibling_ranks,
)
from specdec_ref.trees.tree import TreeRecord, tree_speculative_generate


def test_shape_parents_numbers_the_tree_level_by_level():
    assert shape_parents((2, 1)) == [-1, 0, 0, 1, 2]
    assert shape_parents(()) == [-1]
    assert len(shape_parents((3, 2, 1))) == 1 + 3 + 6 + 6
    assert sibling_ranks(shape_parents((2, 2))) == [0, 1, 2, 1, 2, 1, 2]


@pytest.mark.parametrize("alpha", [0.3, 0.71, 0.95])
@pytest.mark.parametrize("k", [1, 4, 8])
def test_a_chain_gives_chapter_6s_formula(alpha, k):
    expected = (1 - alpha ** (k + 1)) / (1 - alpha)
    assert expected_tokens(shape_parents((1,) * k), [alpha]) == pytest.approx(expected, rel=1e-12)


def test_a_wide_level_accepts_with_one_minus_all_rejected():
    rates = [0.5, 0.4, 0.2]
    assert sum(rank_probabilities(rates)) == pytest.approx(1 - 0.5 * 0.6 * 0.8)
    # Depth 2, widths (3, 2): beta_3 (1 + beta_2).
    beta3, beta2 = 1 - 0.5 * 0.6 * 0.8, 1 - 0.5 * 0.6
    assert expected_accepted(shape_parents((3, 2)), rates) == pytest.approx(beta3 * (1 + beta2))
    # Ranks past the rates are never accepted: a fourth child adds nothing.
    assert expected_accepted(shape_parents((4,)), rates) == pytest.approx(beta3)


def test_rank_rates_counts_trials_and_accepts():
    records = [
        TreeRecord([], [], 2, tries=[1, 2, 2], path=[1, 5]),  # rank 1 ok, rank 2 ok, then 2 rejected
        TreeRecord([], [], 0, tries=[3], path=[]),  # three rejected at the root
    ]
    # rank 1: tried 4 times, accepted once; rank 2: tried 3 times, accepted once; rank 3: once, never.
    assert rank_rates(records) == pytest.approx([1 / 4, 1 / 3, 0.0])
    assert rank_rates(records, max_rank=4)[3] == 0.0


def test_predicted_speedup_and_its_errors():
    assert predicted_speedup(3.0, 1.2, [0.1, 0.1, 0.1]) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="verify_cost"):
        predicted_speedup(3.0, 0.0, [0.1])


def test_the_model_predicts_a_run_it_was_not_fitted_on():
    """Rates read from one shape's trace predict another shape's tokens per pass."""
    target, draft = close_pair_models()
    prompt = torch.tensor([[5, 17, 42, 8, 9, 3]])
    runs = {}
    for widths in ((3, 2, 1), (1, 1, 1)):
        out = tree_speculative_generate(target, draft, prompt, max_new_tokens=96, widths=widths,
                                        sampling=SamplingConfig(temperature=1.0),
                                        generator=torch.Generator().manual_seed(0))
        runs[widths] = out
    rates = rank_rates(runs[(3, 2, 1)].trace)
    predicted = expected_tokens(shape_parents((1, 1, 1)), rates)
    measured = runs[(1, 1, 1)].stats.tokens_per_target_call
    assert abs(predicted - measured) < 0.4  # a model and one short run: loose, but it can fail
    assert 0 < rates[0] <= 1


def close_pair_models():
    target = make_model("llama", layers=2, seed=1)
    return target, noisy_copy(target, noise=0.3, seed=3)
