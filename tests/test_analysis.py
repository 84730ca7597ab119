"""The performance model: closed forms, their simulation, and alpha from a pair."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import make_model

from specdec_ref.acceptance import acceptance_beta, alpha_from_trace, measure_alpha
from specdec_ref.analysis import (
    accepted_count_distribution,
    alpha_from_block_efficiency,
    expected_acceptance_rate,
    expected_speedup,
    expected_tokens,
    iteration_cost,
    optimal_draft_length,
    simulate_acceptance,
    verify_cost_from_latency,
)
from specdec_ref.decoder import IterationRecord
from specdec_ref.rejection import accept_reject
from specdec_ref.sampling import SamplingConfig, sample
from specdec_ref.schedules import ModelBasedDraftLength

ARTICLE_P = [0.5, 0.2, 0.15, 0.1, 0.05]
ARTICLE_Q = [0.1, 0.4, 0.3, 0.15, 0.05]


def test_expected_tokens_hand_computed():
    """1 + alpha + ... + alpha^K: 2.3056 at alpha 0.6, K 4; 1 at alpha 0; K + 1 at alpha 1."""
    assert expected_tokens(0.6, 4) == pytest.approx(1 + 0.6 + 0.36 + 0.216 + 0.1296)
    assert expected_tokens(0.0, 7) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 0) == 1.0


def test_expected_tokens_is_continuous_at_alpha_one():
    """The alpha -> 1 limit K + 1 is approached smoothly, with no cancellation blow-up."""
    assert expected_tokens(1 - 1e-3, 6) == pytest.approx(math.fsum((1 - 1e-3) ** i for i in range(7)), rel=1e-12)
    for eps in (1e-7, 1e-12):
        # First order in eps: 7 - (0 + 1 + ... + 6) eps; the next term is of order 35 eps^2.
        assert expected_tokens(1 - eps, 6) == pytest.approx(7 - 21 * eps, rel=1e-12)


def test_article_worked_example_gives_1_75x_not_1_67x():
    """alpha 0.6, K 4, c = 8/100: 2.31 tokens per 132 ms, 57 ms per token, 1.75x (the article rounds to 2.2)."""
    assert iteration_cost(4, 0.08) == pytest.approx(1.32)
    assert expected_speedup(0.6, 4, 0.08) == pytest.approx(2.3056 / 1.32)
    assert expected_speedup(0.6, 4, 0.08) == pytest.approx(1.7467, abs=1e-4)


def test_accepted_count_distribution_is_a_truncated_geometric():
    """P(N = n) sums to 1 and its mean plus the extra token is E[tokens]."""
    for alpha, k in [(0.3, 3), (0.8, 6), (1.0, 2), (0.0, 2)]:
        law = accepted_count_distribution(alpha, k)
        assert math.fsum(law) == pytest.approx(1.0)
        assert math.fsum(n * pn for n, pn in enumerate(law)) + 1 == pytest.approx(expected_tokens(alpha, k))


@pytest.mark.parametrize("alpha,k", [(0.2, 1), (0.6, 4), (0.9, 8)])
def test_simulation_matches_closed_form(alpha, k):
    """Monte Carlo iterations agree with E[tokens] (within 4 standard errors) and with P(N = n)."""
    result = simulate_acceptance(alpha, k, num_iterations=200_000, generator=torch.Generator().manual_seed(0))
    assert abs(result.mean_tokens - expected_tokens(alpha, k)) < 4 * result.standard_error
    for observed, expected in zip(result.frequencies(k), accepted_count_distribution(alpha, k), strict=True):
        assert observed == pytest.approx(expected, abs=0.005)


def test_acceptance_beta_is_overlap_of_p_and_q():
    """beta = sum min(p, q): 0.6 for the article's errata pair, 1 for p = q, 0 for disjoint supports."""
    p, q = torch.tensor(ARTICLE_P), torch.tensor(ARTICLE_Q)
    assert float(acceptance_beta(p, q)) == pytest.approx(0.6)
    assert float(acceptance_beta(p, p)) == pytest.approx(1.0)
    assert float(acceptance_beta(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))) == 0.0
    assert acceptance_beta(torch.stack([p, q]), torch.stack([q, q])).shape == (2,)
    with pytest.raises(ValueError, match="same shape"):
        acceptance_beta(p, q[:3])


def test_rejection_rule_accepts_each_draft_with_probability_beta():
    """With fixed p and q at every slot, real accept_reject blocks emit E[tokens](beta, K) on average."""
    k, iterations = 3, 4000
    generator = torch.Generator().manual_seed(0)
    p, q = torch.tensor(ARTICLE_P), torch.tensor(ARTICLE_Q)
    draft_probs, target_probs = q.expand(k, -1), p.expand(k + 1, -1)  # (K, V), (K + 1, V)
    lengths = []
    for _ in range(iterations):
        tokens = sample(draft_probs, generator)  # (K,)
        lengths.append(len(accept_reject(tokens, draft_probs, target_probs, generator)))
    mean = sum(lengths) / iterations
    sd = (sum((x - mean) ** 2 for x in lengths) / (iterations - 1)) ** 0.5
    assert abs(mean - expected_tokens(0.6, k)) < 4 * sd / iterations**0.5


def test_verify_cost_forms_agree():
    """v(K) as a callable, a str-keyed dict (the benchmark's) or a list indexed by K gives one speedup."""
    table = {"1": 1.1, "2": 1.2, "3": 1.3, "4": 1.5}
    expected = expected_tokens(0.7, 4) / (4 * 0.1 + 1.5)
    assert expected_speedup(0.7, 4, 0.1, table) == pytest.approx(expected)
    assert expected_speedup(0.7, 4, 0.1, [1.0, 1.1, 1.2, 1.3, 1.5]) == pytest.approx(expected)
    assert expected_speedup(0.7, 4, 0.1, lambda k: 1 + k / 8) == pytest.approx(expected)
    assert expected_speedup(0.7, 0, 0.1, table) == 1.0
    with pytest.raises(ValueError, match="K=5"):
        expected_speedup(0.7, 5, 0.1, table)


def test_optimal_draft_length_hand_computed_and_bounded():
    """alpha 0.8, c 0.05 peaks at K = 8; a tiny alpha gives min_k; c = 0 gives max_k."""
    assert optimal_draft_length(0.8, 0.05, max_k=16) == 8
    assert optimal_draft_length(0.8, 0.05, max_k=5) == 5
    assert optimal_draft_length(0.01, 0.05, max_k=16) == 1
    assert optimal_draft_length(0.01, 0.05, max_k=16, min_k=3) == 3
    assert optimal_draft_length(0.9, 0.0, max_k=10) == 10


def test_optimal_draft_length_is_the_brute_force_argmax():
    """The chosen K maximises expected_speedup over the range, for a grid of alpha and c."""
    for alpha in (0.1, 0.4, 0.7, 0.95):
        for c in (0.01, 0.1, 0.3):
            best = optimal_draft_length(alpha, c, max_k=12)
            assert all(expected_speedup(alpha, best, c) >= expected_speedup(alpha, k, c) for k in range(1, 13))


def test_costly_verification_shortens_the_optimal_draft():
    """When a K + 1 token pass costs more than one step, the best K is smaller."""
    flat = optimal_draft_length(0.8, 0.05, max_k=16)
    steep = optimal_draft_length(0.8, 0.05, max_k=16, verify_cost=lambda k: 1 + 0.25 * k)
    assert steep < flat


def test_model_based_schedule_stays_within_bounds():
    """ModelBasedDraftLength, driven by optimal_draft_length, keeps K in [min_k, max_k] and follows alpha."""
    schedule = ModelBasedDraftLength(cost_ratio=0.1, min_k=2, max_k=6, verify_cost={str(k): 1.0 for k in range(7)})
    seen = []
    for _ in range(50):
        k = schedule.next_k()
        seen.append(k)
        schedule.update(k, k)
    assert all(2 <= k <= 6 for k in seen) and seen[-1] == 6
    for _ in range(200):
        k = schedule.next_k()
        assert 2 <= k <= 6
        schedule.update(k, 0)
    assert schedule.next_k() == 2


def test_alpha_from_trace_counts_only_tested_drafts():
    """Drafts after a rejection are never tested: 2 accepted of 3 tested plus 4 of 4 is 6/7."""
    trace = [IterationRecord([1, 2, 3, 4], [1, 2, 9], 2), IterationRecord([5, 6, 7, 8], [5, 6, 7, 8, 3], 4)]
    assert alpha_from_trace(trace) == pytest.approx(6 / 7)
    assert math.isnan(alpha_from_trace([]))


def test_alpha_from_block_efficiency_inverts_expected_tokens():
    """Measured tokens per target call map back to the alpha that produces them; the ends map to 0 and 1."""
    for alpha, k in [(0.05, 1), (0.63, 5), (0.97, 8)]:
        assert alpha_from_block_efficiency(expected_tokens(alpha, k), k) == pytest.approx(alpha, abs=1e-9)
    assert alpha_from_block_efficiency(1.0, 4) == pytest.approx(0.0, abs=1e-12)
    assert alpha_from_block_efficiency(5.0, 4) == pytest.approx(1.0, abs=1e-12)
    with pytest.raises(ValueError, match="block_efficiency"):
        alpha_from_block_efficiency(5.5, 4)


def test_measure_alpha_is_one_for_identical_models(pair):
    """A model drafting for itself has beta = 1 at every position."""
    target, _ = pair
    prompts = [torch.tensor([[2, 3, 4]]), torch.tensor([[5, 6]])]
    estimate = measure_alpha(target, target, prompts, max_new_tokens=6, generator=torch.Generator().manual_seed(0))
    assert len(estimate.betas) == 2 * 7
    assert estimate.alpha == pytest.approx(1.0, abs=1e-5)


def test_measure_alpha_of_a_mismatched_pair_lies_strictly_between_0_and_1(pair):
    """Different random models overlap partly; greedy betas are 0 or 1 (argmax agreement)."""
    target, draft = pair
    prompts = [torch.tensor([[2, 3, 4]]), torch.tensor([[7, 8, 9, 10]])]
    sampled = measure_alpha(target, draft, prompts, max_new_tokens=10, generator=torch.Generator().manual_seed(0))
    assert 0 < sampled.alpha < 1 and sampled.standard_error > 0
    greedy = measure_alpha(target, draft, prompts, max_new_tokens=10, sampling=SamplingConfig(temperature=0))
    assert all(b in (0.0, 1.0) for b in greedy.betas)


def test_bad_arguments_raise_value_errors_naming_them():
    """alpha outside [0, 1], negative c, K < 0 and an empty range are refused by name."""
    with pytest.raises(ValueError, match="alpha"):
        expected_tokens(1.2, 3)
    with pytest.raises(ValueError, match="cost_ratio"):
        expected_speedup(0.5, 3, -0.1)
    with pytest.raises(ValueError, match="k must"):
        expected_tokens(0.5, -1)
    with pytest.raises(ValueError, match="max_k"):
        optimal_draft_length(0.5, 0.1, max_k=2, min_k=3)
    with pytest.raises(ValueError, match="prompts"):
        measure_alpha(make_model("gpt2"), make_model("gpt2"), [], max_new_tokens=2)


def test_expected_acceptance_rate_is_below_alpha_and_matches_simulation():
    """accepted / drafted = (E[tokens] - 1) / K: alpha at K = 1, lower beyond, as simulated."""
    assert expected_acceptance_rate(0.6, 1) == pytest.approx(0.6)
    assert expected_acceptance_rate(0.6, 4) == pytest.approx((2.3056 - 1) / 4)
    assert expected_acceptance_rate(1.0, 5) == 1.0 and expected_acceptance_rate(0.0, 5) == 0.0
    rates = [expected_acceptance_rate(0.7, k) for k in range(1, 9)]
    assert all(a > b for a, b in zip(rates[:-1], rates[1:], strict=True))  # falls with K while alpha stays 0.7
    k = 4
    result = simulate_acceptance(0.7, k, num_iterations=100_000, generator=torch.Generator().manual_seed(1))
    simulated = float(result.accepted.double().mean()) / k
    assert simulated == pytest.approx(expected_acceptance_rate(0.7, k), abs=4 * result.standard_error / k)
    with pytest.raises(ValueError, match="k must"):
        expected_acceptance_rate(0.5, 0)


def test_verify_cost_from_latency_divides_by_the_one_token_pass():
    """{m - 1: t(m) / t(1)}: v(0) = 1, and the table feeds expected_speedup directly."""
    table = verify_cost_from_latency((1, 2, 5), (0.010, 0.011, 0.015))
    assert table == pytest.approx({0: 1.0, 1: 1.1, 4: 1.5})
    assert expected_speedup(0.7, 4, 0.1, table) == pytest.approx(expected_tokens(0.7, 4) / 1.9)
    with pytest.raises(ValueError, match="include 1"):
        verify_cost_from_latency((2, 4), (0.1, 0.2))
    with pytest.raises(ValueError, match="same length"):
        verify_cost_from_latency((1, 2), (0.1,))
    with pytest.raises(ValueError, match="> 0"):
        verify_cost_from_latency((1, 2), (0.0, 0.1))
