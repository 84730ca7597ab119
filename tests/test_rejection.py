"""The rejection rule emits tokens distributed exactly as the target's p."""

import itertools

import pytest
import torch
from scipy.stats import chisquare

from specdec_ref.rejection import (
    accept_reject,
    accept_reject_article,
    emission_distribution,
    next_token_law,
    residual_distribution,
)
from specdec_ref.sampling import SamplingConfig, logits_to_probs


def peaked(rows: list[list[float]]) -> torch.Tensor:
    """Normalize hand-written rows into float64 distributions."""
    t = torch.tensor(rows, dtype=torch.float64)
    return t / t.sum(-1, keepdim=True)


# Hand-built, peaked distributions with zeros on either side (V = 4).
P_ROWS = [[0.7, 0.2, 0.1, 0.0], [0.0, 0.05, 0.15, 0.8], [0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 1.0, 0.0],
          [0.1, 0.6, 0.0, 0.3]]
Q_ROWS = [[0.1, 0.1, 0.0, 0.8], [0.5, 0.5, 0.0, 0.0], [0.97, 0.01, 0.01, 0.01], [0.3, 0.3, 0.4, 0.0]]


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_enumerated_emission_follows_target(k):
    """By exact enumeration: token 0 ~ p_0, and token i ~ p_i given i accepted drafts."""
    q, p = peaked(Q_ROWS[:k]), peaked(P_ROWS[: k + 1])
    law = emission_distribution(q, p)
    assert abs(sum(law.values()) - 1) < 1e-12
    v = p.size(1)
    for i in range(k + 1):
        # Every prefix of i tokens that can be emitted as accepted drafts.
        for prefix in itertools.product(range(v), repeat=i):
            reachable = any(len(s) > i and s[:i] == prefix for s in law)
            if reachable:
                assert torch.allclose(next_token_law(law, prefix, v), p[i], atol=1e-9), (i, prefix)


def test_enumeration_shows_the_article_rule_is_biased():
    """Resampling from p after a rejection gives min(p, q) + (1 - beta) p, not p."""
    p = torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]] * 2, dtype=torch.float64)
    q = torch.tensor([[0.1, 0.4, 0.3, 0.15, 0.05]], dtype=torch.float64)
    first = next_token_law(emission_distribution(q, p, rule="article"), (), 5)
    # The errata's worked example: [.30, .28, .21, .14, .07], total variation 0.20.
    assert torch.allclose(first, torch.tensor([0.30, 0.28, 0.21, 0.14, 0.07], dtype=torch.float64), atol=1e-12)
    assert abs(0.5 * (first - p[0]).abs().sum().item() - 0.20) < 1e-12
    exact = next_token_law(emission_distribution(q, p), (), 5)
    assert torch.allclose(exact, p[0], atol=1e-12)


def test_residual_distribution_is_normalized_positive_part():
    """normalize(max(0, p - q)); p itself where p == q leaves no residual mass."""
    p = torch.tensor([0.5, 0.3, 0.2])
    q = torch.tensor([0.2, 0.5, 0.3])
    assert torch.allclose(residual_distribution(p, q), torch.tensor([1.0, 0.0, 0.0]))
    assert torch.allclose(residual_distribution(p, p), p)


def monte_carlo_first_tokens(rule, q, p, n, seed):
    """Counts of the token emitted at each position, given the earlier ones were accepted."""
    generator = torch.Generator().manual_seed(seed)
    k, v = q.shape
    counts = torch.zeros(k + 1, v)
    for _ in range(n):
        drafts = torch.stack([torch.multinomial(q[i], 1, generator=generator)[0] for i in range(k)])
        emitted = rule(drafts, q, p, generator)
        for i, token in enumerate(emitted):
            counts[i, token] += 1
    return counts


def chi_square_pvalues(counts, p):
    """One chi-square test per position against p_i (cells with p_i = 0 must be empty)."""
    pvalues = []
    for i in range(counts.size(0)):
        support = p[i] > 0
        assert counts[i][~support].sum() == 0, f"position {i} emitted a token p gives no mass"
        observed = counts[i][support]
        if observed.numel() == 1 or observed.sum() < 20:
            # One allowed token (the support check above is the test), or too few samples.
            continue
        expected = p[i][support].double() / p[i][support].double().sum() * observed.sum()
        pvalues.append(chisquare(observed.double().numpy(), expected.numpy(), sum_check=False).pvalue)
    return pvalues


def truncated_pair(sampling, k, v, seed):
    """Draft and target distributions processed by top-k / top-p, as the decoder does."""
    g = torch.Generator().manual_seed(seed)
    q = logits_to_probs(torch.randn(k, v, generator=g) * 2, sampling)
    p = logits_to_probs(torch.randn(k + 1, v, generator=g) * 2, sampling)
    return q, p


@pytest.mark.parametrize(
    "sampling", [SamplingConfig(1.0), SamplingConfig(0.7, top_k=4), SamplingConfig(1.0, top_p=0.8)]
)
def test_monte_carlo_accept_reject_matches_target(sampling):
    """Chi-square per position at a fixed seed, including truncated distributions."""
    q, p = truncated_pair(sampling, k=3, v=8, seed=11)
    counts = monte_carlo_first_tokens(accept_reject, q, p, n=6000, seed=0)
    pvalues = chi_square_pvalues(counts, p)
    assert len(pvalues) >= 2  # at least the first two positions were tested
    # 12 tests (3 settings x 4 positions) at a family-wise level of 0.001: Bonferroni.
    assert min(pvalues) > 1e-3 / 12, pvalues


def test_chi_square_detects_the_article_rule():
    """The same statistical test rejects the biased rule: it has power."""
    q, p = truncated_pair(SamplingConfig(1.0), k=3, v=8, seed=11)
    counts = monte_carlo_first_tokens(accept_reject_article, q, p, n=6000, seed=0)
    assert chi_square_pvalues(counts, p)[0] < 1e-6


def test_token_with_zero_target_mass_is_never_accepted():
    """u * q < p with a strict '<' rejects x whenever p(x) = 0, even if u == 0."""
    q = torch.tensor([[0.5, 0.5, 0.0]])
    p = torch.tensor([[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]])
    generator = torch.Generator().manual_seed(0)
    for _ in range(200):
        assert accept_reject(torch.tensor([0]), q, p, generator)[0] != 0


def test_identical_distributions_accept_everything():
    """p == q: every draft is accepted and a bonus token follows (zero residual never used)."""
    q = peaked(Q_ROWS[:3]).float()
    p = torch.cat([q, peaked(P_ROWS[:1]).float()])
    generator = torch.Generator().manual_seed(1)
    for _ in range(100):
        drafts = torch.stack([torch.multinomial(q[i], 1, generator=generator)[0] for i in range(3)])
        emitted = accept_reject(drafts, q, p, generator)
        assert emitted[:3] == drafts.tolist() and len(emitted) == 4


def test_greedy_path_accepts_while_draft_is_argmax():
    """Greedy: keep drafts equal to argmax p_i, then emit argmax p at the first mismatch."""
    p = torch.eye(5)[[2, 4, 1, 3]]  # argmax 2, 4, 1, then bonus 3
    q = torch.eye(5)[[2, 4, 0]]
    assert accept_reject(torch.tensor([2, 4, 0]), q, p, greedy=True) == [2, 4, 1]
    assert accept_reject(torch.tensor([2, 4, 1]), torch.eye(5)[[2, 4, 1]], p, greedy=True) == [2, 4, 1, 3]
    assert accept_reject(torch.tensor([0, 4, 1]), torch.eye(5)[[0, 4, 1]], p, greedy=True) == [2]


def test_no_drafts_emits_one_token_from_p():
    """K = 0 is one plain target step."""
    p = torch.tensor([[0.0, 1.0, 0.0]])
    assert accept_reject(torch.empty(0, dtype=torch.long), torch.empty(0, 3), p) == [1]


@pytest.mark.parametrize(
    "tokens, q, p, match",
    [
        (torch.tensor([0]), torch.tensor([[float("nan"), 1.0]]), torch.full((2, 2), 0.5), "draft_probs.*NaN"),
        (torch.tensor([0]), torch.full((1, 2), 0.5), torch.tensor([[0.5, float("nan")], [0.5, 0.5]]),
         "target_probs.*NaN"),
        (torch.tensor([0]), torch.tensor([[0.0, 1.0]]), torch.full((2, 2), 0.5), "zero mass"),
        (torch.tensor([0, 1]), torch.full((1, 2), 0.5), torch.full((3, 2), 0.5), "draft_probs must have shape"),
        (torch.tensor([0]), torch.full((1, 2), 0.5), torch.full((1, 2), 0.5), "target_probs must have shape"),
        (torch.tensor([5]), torch.full((1, 2), 0.5), torch.full((2, 2), 0.5), "draft_tokens must lie"),
        (torch.tensor([0]), torch.tensor([[0.9, 0.9]]), torch.full((2, 2), 0.5), "sum to 1"),
        (torch.tensor([0]), torch.tensor([[1.5, -0.5]]), torch.full((2, 2), 0.5), "negative"),
    ],
)
def test_malformed_inputs_raise_clear_errors(tokens, q, p, match):
    """NaN, zero draft mass, wrong shapes and out-of-range tokens name the argument."""
    with pytest.raises(ValueError, match=match):
        accept_reject(tokens, q, p)


def test_trusted_blocks_emit_the_same_tokens_and_still_refuse_nan():
    """The decoder's fast path (trusted=True) skips only the checks that hold by
    construction: same draws from the same generator, and NaN rows still raise."""
    q, p = peaked(Q_ROWS).float(), peaked(P_ROWS).float()
    for seed in range(50):
        tokens = torch.multinomial(q, 1, generator=torch.Generator().manual_seed(seed))[:, 0]
        full = accept_reject(tokens, q, p, torch.Generator().manual_seed(seed))
        fast = accept_reject(tokens, q, p, torch.Generator().manual_seed(seed), trusted=True)
        assert fast == full
    broken = p.clone()
    broken[1, 2] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        accept_reject(tokens, q, broken, trusted=True)
