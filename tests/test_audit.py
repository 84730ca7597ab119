"""The exactness audit passes an exact decoder, fails a biased one, and says how much it can see."""

import copy
import math

import pytest
import torch
from scipy.stats import chi2, ncx2

from specdec_ref import speculative_generate
from specdec_ref.article import article_generate
from specdec_ref.audit import (
    _chi2_critical,
    _noncentral_power,
    audit,
    chi2_sf,
    compare_counts,
    decoder_law,
    detectable_tv,
    law_tv,
    sample_emissions,
    small_random_pair,
    target_law,
    transformers_assisted,
)
from specdec_ref.fast import prepare
from specdec_ref.sampling import SamplingConfig

PROMPT = torch.tensor([[1, 2, 3]])


@pytest.fixture(scope="module")
def small_pair():
    """A random target / draft pair on 8 tokens whose p and q disagree (article TV about 0.2)."""
    return small_random_pair(8, seed=4)


def law_sampler(law: dict[tuple[int, ...], float]):
    """A generate-like callable that emits outcomes of a given law (no model)."""
    outcomes = list(law)
    weights = torch.tensor([law[o] for o in outcomes], dtype=torch.float64)

    def generate(input_ids, generator):
        index = int(torch.multinomial(weights, 1, generator=generator))
        return torch.cat([input_ids, torch.tensor([outcomes[index]])], dim=1)

    return generate


def test_chi_square_tails_match_scipy():
    """The torch-only chi-square tail, critical value and noncentral power agree with scipy."""
    for df in (1, 4, 12, 63):
        for x in (0.5, df, 3.0 * df + 10):
            assert chi2_sf(x, df) == pytest.approx(chi2.sf(x, df), rel=1e-9, abs=1e-15)
        critical = _chi2_critical(1e-3, df)
        assert critical == pytest.approx(chi2.isf(1e-3, df), rel=1e-9)
        for lam in (0.5, 10.0, 80.0):
            assert _noncentral_power(critical, df, lam) == pytest.approx(ncx2.sf(critical, df, lam), abs=1e-9)


def test_detectable_tv_shrinks_as_one_over_root_n():
    """Four times the samples halve the detectable TV; more cells need a larger one."""
    small, large = detectable_tv(500, 8), detectable_tv(2000, 8)
    assert large == pytest.approx(small / 2, rel=1e-6)
    assert detectable_tv(2000, 64) > large


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(top_k=3), SamplingConfig(0.7, top_p=0.8)],
                         ids=["T=1", "top-k", "T=0.7 top-p"])
def test_exact_rule_enumerates_to_the_target_law(small_pair, sampling):
    """Enumerated over drafts and blocks, the exact rule's first two tokens follow the target to 1e-12."""
    target, draft = small_pair
    exact = target_law(target, PROMPT, sampling, 2)
    for k in (1, 2, 3):
        assert law_tv(decoder_law(target, draft, PROMPT, num_draft_tokens=k, sampling=sampling, num_tokens=2),
                      exact) < 1e-12
    article = decoder_law(target, draft, PROMPT, num_draft_tokens=2, sampling=sampling, num_tokens=2,
                          rule="article")
    assert law_tv(article, exact) > 0.1


@pytest.mark.parametrize("prepared", [False, True], ids=["models", "prepared"])
def test_audit_passes_the_package_decoder(small_pair, prepared):
    """speculative_generate's first two tokens are consistent with the target's law, on the
    models as built and on the path `fast.prepare` sets up (against its prepared target's law)."""
    target, draft = small_pair
    sampling = SamplingConfig()
    if prepared:
        fast = prepare(copy.deepcopy(draft), copy.deepcopy(target))
        target, draft = fast.target_model, fast.draft

    def ours(input_ids, generator):
        return speculative_generate(target, draft, input_ids, max_new_tokens=3, num_draft_tokens=2,
                                    sampling=sampling, generator=generator)

    result = audit(ours, PROMPT, target_law(target, PROMPT, sampling, 2), num_samples=400, num_tokens=2,
                   generator=torch.Generator().manual_seed(0))
    assert result.passed, result
    assert result.detectable_tv < 0.25


@pytest.mark.slow
def test_audit_fails_the_article_loop(small_pair):
    """The article's loop (residual p - p = 0) fails on a pair where p != q, and its TV is bounded away from 0."""
    target, draft = small_pair

    def article(input_ids, generator):
        return article_generate(target, draft, input_ids, max_new_tokens=2, num_draft_tokens=2, generator=generator)

    exact = target_law(target, PROMPT, SamplingConfig(), 2)
    # 600 samples: at 400 the lower bound of a TV of 0.22 fell below 0.05 for one seed in eight.
    result = audit(article, PROMPT, exact, num_samples=600, num_tokens=2, generator=torch.Generator().manual_seed(0))
    assert not result.passed, result
    assert result.tv_lower_bound > 0.05
    # And it is consistent with the law the article's rule predicts.
    predicted = decoder_law(target, draft, PROMPT, num_draft_tokens=2, num_tokens=2, rule="article")
    again = audit(article, PROMPT, predicted, num_samples=400, num_tokens=2,
                  generator=torch.Generator().manual_seed(1))
    assert again.passed, again


def test_audit_of_transformers_assisted_generation_runs(small_pair):
    """The transformers wrapper is a generate-like callable; its samples follow its own first token law."""
    target, draft = small_pair
    sampling = SamplingConfig(top_k=3)
    generate = transformers_assisted(target, draft, max_new_tokens=2, num_draft_tokens=2, sampling=sampling)
    counts = sample_emissions(generate, PROMPT, num_samples=50, num_tokens=2,
                              generator=torch.Generator().manual_seed(0))
    exact = target_law(target, PROMPT, sampling, 2)
    assert sum(counts.values()) == 50
    # Top-k 3 leaves 3 first tokens and 3 second tokens: nothing outside the exact law's support.
    assert set(counts) <= set(exact)


@pytest.mark.slow
def test_stated_power_holds_for_a_biased_sampler():
    """A sampler at the detectable TV from the law fails in at least `power` of repeated audits."""
    law = {(0,): 0.4, (1,): 0.3, (2,): 0.2, (3,): 0.1}
    n = 300
    epsilon = detectable_tv(n, 4, level=0.01, power=0.9)
    biased = {(0,): 0.4 - epsilon, (1,): 0.3, (2,): 0.2, (3,): 0.1 + epsilon}  # TV = epsilon
    generator = torch.Generator().manual_seed(0)
    failures = sum(not audit(law_sampler(biased), PROMPT, law, num_samples=n, level=0.01,
                             first_token_speculative=True, generator=generator).passed for _ in range(60))
    assert failures >= 0.8 * 60  # 0.9 expected; margin for 60 trials


@pytest.mark.slow
def test_exact_sampler_fails_at_about_the_level():
    """An exact sampler fails at about the test's size, and its TV stays under tv_noise."""
    law = {(0,): 0.4, (1,): 0.3, (2,): 0.2, (3,): 0.1}
    generator = torch.Generator().manual_seed(0)
    results = [audit(law_sampler(law), PROMPT, law, num_samples=300, level=0.05, first_token_speculative=True,
                     generator=generator) for _ in range(60)]
    assert sum(not r.passed for r in results) <= 12  # 3 expected
    assert all(r.tv_estimate < r.tv_noise for r in results)


def test_impossible_outcomes_fail_the_audit():
    """One emitted outcome outside the law's support is a failure, whatever the p-value."""
    law = {(0,): 0.5, (1,): 0.5}
    result = compare_counts({(0,): 50, (1,): 49, (2,): 1}, law)
    assert result.impossible == 1 and not result.passed
    assert result.tv_estimate == pytest.approx(0.5 * (0.0 + 0.01 + 0.01))


def test_rare_outcomes_are_pooled():
    """Outcomes expected fewer than 5 times share one cell."""
    law = {(i,): 0.01 for i in range(10)} | {(10,): 0.9}
    result = compare_counts({(10,): 90, (0,): 10}, law)
    assert result.num_cells == 2
    assert math.isfinite(result.statistic)


def test_summary_fits_the_page(small_pair):
    """Both verdict lines stay within 80 characters."""
    law = {(0,): 0.5, (1,): 0.5}
    for counts in ({(0,): 5000, (1,): 5000}, {(0,): 9000, (1,): 1000}):
        line = compare_counts(counts, law).summary()
        assert len(line) <= 80, line


def test_errors_name_the_argument(small_pair):
    """Malformed arguments raise errors that name them."""
    target, draft = small_pair
    law = {(0,): 0.5, (1,): 0.5}
    with pytest.raises(ValueError, match="num_samples"):
        audit(law_sampler(law), PROMPT, law, num_samples=0)
    with pytest.raises(ValueError, match="num_tokens"):
        audit(law_sampler(law), PROMPT, law, num_samples=10, num_tokens=2)
    with pytest.raises(TypeError, match="generate must be callable"):
        sample_emissions(None, PROMPT, num_samples=3)
    with pytest.raises(ValueError, match="level"):
        compare_counts({(0,): 1}, law, level=1.5)
    with pytest.raises(ValueError, match="law must"):
        compare_counts({(0,): 1}, {(0,): 0.7})
    with pytest.raises(ValueError, match="max_outcomes"):
        target_law(target, PROMPT, num_tokens=9)
    with pytest.raises(ValueError, match="rule"):
        decoder_law(target, draft, PROMPT, num_draft_tokens=2, rule="typo")
    with pytest.raises(ValueError, match="num_draft_tokens"):
        decoder_law(target, draft, PROMPT, num_draft_tokens=0)
    with pytest.raises(ValueError, match="vocab_size"):
        small_random_pair(1)
    with pytest.raises(TypeError, match="generate must return"):
        sample_emissions(lambda ids, g: [1, 2], PROMPT, num_samples=1)


def test_audit_refuses_one_token_unless_it_is_speculative(small_pair):
    """One token audits only the prefill in many decoders: refused unless the caller says it was drafted."""
    target, draft = small_pair
    law = target_law(target, PROMPT, SamplingConfig(), 1)
    with pytest.raises(ValueError, match="first_token_speculative"):
        audit(law_sampler(law), PROMPT, law, num_samples=10)
    assert audit(law_sampler(law), PROMPT, law, num_samples=100, first_token_speculative=True).num_samples == 100


def test_a_crash_is_a_verdict(small_pair):
    """A callable that raises fails the audit with "crashed: <error>" instead of raising."""
    law = {(0, 0): 0.5, (1, 1): 0.5}

    def broken(input_ids, generator):
        raise RuntimeError("cache out of sync")

    result = audit(broken, PROMPT, law, num_samples=5, num_tokens=2)
    assert not result.passed
    assert result.summary() == "FAIL: crashed: RuntimeError: cache out of sync"
    short = audit(lambda ids, g: ids, PROMPT, law, num_samples=5, num_tokens=2)
    assert not short.passed and "fewer than num_tokens" in short.summary()


@pytest.mark.parametrize("k, tokens", [(1, 2), (2, 3)])
def test_audit_over_more_tokens_than_drafts_sees_the_bonus(small_pair, k, tokens):
    """With m > K the outcome spans a bonus token: the package passes, a bonus from p_{K-1} fails."""
    from biased import buggy_generate

    target, draft = small_pair
    sampling = SamplingConfig()
    exact = target_law(target, PROMPT, sampling, tokens)

    def decoder(bug):
        return lambda ids, g: buggy_generate(target, draft, ids, max_new_tokens=tokens, num_draft_tokens=k,
                                             sampling=sampling, generator=g, bug=bug)

    ours = lambda ids, g: speculative_generate(target, draft, ids, max_new_tokens=tokens, num_draft_tokens=k,  # noqa: E731
                                               sampling=sampling, generator=g)
    kwargs = {"num_samples": 250, "num_tokens": tokens, "generator": torch.Generator().manual_seed(0)}
    assert audit(ours, PROMPT, exact, **kwargs).passed
    assert not audit(decoder("bonus_position"), PROMPT, exact, **kwargs).passed


def test_generate_reference_is_generates_top_k_50():
    """generate's own law (top_k = 50 by default) is rebuilt from transformers' warpers."""
    from specdec_ref.laws import generate_reference, reference_probs

    target, _ = small_random_pair(64, seed=1)
    logits = target(torch.tensor([[1, 2, 3]])).logits[0].detach()  # (3, V)
    theirs = reference_probs(logits, generate_reference(target))
    assert torch.allclose(theirs, reference_probs(logits, SamplingConfig(top_k=50)), atol=1e-6)
    assert not torch.allclose(theirs, reference_probs(logits, SamplingConfig()), atol=1e-6)
    cooler = generate_reference(target, temperature=0.7, top_p=0.9)
    assert torch.allclose(reference_probs(logits, cooler),
                          reference_probs(logits, SamplingConfig(0.7, top_k=50, top_p=0.9)), atol=1e-6)
    with pytest.raises(ValueError, match="may set only"):
        generate_reference(target, repetition_penalty=1.2)
