"""Prompt lookup drafts by n-gram matching, and its one-hot q keeps the output exactly the target's."""


import pytest
import torch
from conftest import chi_square_pvalue, exact_joint_law, generator_on, make_model
from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

from specdec_ref import SamplingConfig, autoregressive_generate
from specdec_ref import decoder as decoder_module
from specdec_ref.decoder import speculative_generate
from specdec_ref.drafting import ModelDrafter, is_drafter
from specdec_ref.kv_cache import make_logits_source
from specdec_ref.lookup import PromptLookupDrafter, one_hot_draft
from specdec_ref.rejection import (
    accept_reject_article,
    emission_distribution,
    next_token_law,
    residual_distribution,
)
from specdec_ref.verification import target_distributions

GREEDY = SamplingConfig(temperature=0.0)


def ids(*tokens: int) -> torch.Tensor:
    return torch.tensor([tokens])


# --- The n-gram lookup -------------------------------------------------------------------


def test_longest_matching_ngram_wins():
    """The 3-gram suffix's continuation beats the more recent 1-gram's."""
    sequence = ids(5, 1, 2, 3, 7, 9, 3, 8, 1, 2, 3)
    assert PromptLookupDrafter(max_ngram_size=3).lookup(sequence, 3).tolist() == [7, 9, 3]
    assert PromptLookupDrafter(max_ngram_size=3).match(sequence) == 4  # where the copy starts
    # Only 1-grams allowed: the last earlier "3" (index 6) is followed by 8, 1, 2.
    assert PromptLookupDrafter(max_ngram_size=1).lookup(sequence, 3).tolist() == [8, 1, 2]


def test_last_earlier_occurrence_wins():
    """Of two earlier occurrences of the suffix, the later one is copied ("first": transformers')."""
    sequence = ids(1, 2, 4, 1, 2, 5, 1, 2)
    assert PromptLookupDrafter().lookup(sequence, 3).tolist() == [5, 1, 2]
    assert PromptLookupDrafter(occurrence="first").lookup(sequence, 3).tolist() == [4, 1, 2]


def test_no_match_drafts_nothing():
    """No earlier occurrence of any suffix n-gram: K = 0, an empty (0, V) q."""
    drafter = PromptLookupDrafter()
    for sequence in (ids(1, 2, 3, 4), ids(7)):
        proposal = drafter.draft(sequence, 10, vocab_size=9)
        assert proposal.tokens.shape == (0,) and proposal.probs.shape == (0, 9)
        assert drafter.match(sequence) is None
    assert drafter.lookup(ids(1, 2, 1, 2), 0).tolist() == []  # K = 0 asked: nothing


def test_drafts_are_clipped_at_the_sequence_end():
    """A match near the end proposes only the tokens that exist, never more than K."""
    drafter = PromptLookupDrafter(num_draft_tokens=10)
    assert drafter.lookup(ids(7, 8, 9, 7), 10).tolist() == [8, 9, 7]
    # The suffix may overlap its earlier occurrence: 4 4 4 -> "4 4" at 0 -> one token.
    assert drafter.lookup(ids(4, 4, 4), 10).tolist() == [4]
    assert drafter.lookup(ids(1, 2, 3, 4, 5, 1), 2).tolist() == [2, 3]


def test_draft_is_one_hot_on_the_proposed_tokens():
    """q is a point mass: row i is e_{x_i}, on the sequence's device."""
    proposal = PromptLookupDrafter().draft(ids(3, 1, 2, 3, 1), 4, vocab_size=6)
    assert proposal.tokens.tolist() == [2, 3, 1]
    assert torch.equal(proposal.probs, torch.eye(6)[[2, 3, 1]])


def test_first_occurrence_reproduces_transformers_candidates():
    """occurrence="first" proposes what transformers' PromptLookupCandidateGenerator does."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(40):
        length = int(torch.randint(2, 40, (1,), generator=generator))
        sequence = torch.randint(0, 4, (1, length), generator=generator)  # 4 tokens: many matches
        for n, k in ((1, 3), (2, 10), (3, 5)):
            # An EOS id no token takes: transformers 4.56 calls torch.isin(..., eos) without a None check.
            reference = PromptLookupCandidateGenerator(eos_token_id=torch.tensor([99]), num_output_tokens=k,
                                                       max_matching_ngram_size=n, max_length=1000)
            candidates, _ = reference.get_candidates(sequence)
            ours = PromptLookupDrafter(max_ngram_size=n, occurrence="first").lookup(sequence, k)
            assert candidates[0, length:].tolist() == ours.tolist(), (sequence.tolist(), n, k)


# --- Exactness: enumeration, chi-square, greedy -----------------------------------------


def small_model(vocab: int = 5):
    return make_model("gpt2", layers=1, width=32, vocab=vocab, seed=7, init_range=0.5)


@pytest.mark.parametrize("sampling", [SamplingConfig(1.0), SamplingConfig(0.7, top_k=3),
                                      SamplingConfig(1.0, top_p=0.8)])
def test_one_hot_rule_is_exact_by_enumeration(sampling, device):
    """With q one-hot, each emitted token is distributed as p: acceptance p(x), residual p without x."""
    model, prompt = small_model().to(device), ids(1, 2, 3, 1, 2).to(device)
    proposal = PromptLookupDrafter().draft(prompt, 3, vocab_size=5)
    assert proposal.tokens.tolist() == [3, 1, 2]
    assert proposal.probs.device == prompt.device
    # p from the device; the enumeration below is float64 arithmetic on the CPU.
    p = target_distributions(model, prompt, proposal.tokens, sampling).double().cpu()  # (K + 1, V)
    p = p / p.sum(-1, keepdim=True)  # rows that sum to 1 in float64, not only in float32
    law = emission_distribution(proposal.probs.cpu(), p)
    assert abs(sum(law.values()) - 1) < 1e-12
    for i in range(4):
        # Token i, given the first i drafts were accepted, follows p_i.
        prefix = tuple(proposal.tokens[:i].tolist())
        assert torch.allclose(next_token_law(law, prefix, 5), p[i], rtol=0, atol=1e-12), i
    # The rule in closed form, for every possible draft x at slot 0.
    for x in range(5):
        q = one_hot_draft(torch.tensor([x]), 5).probs.double()  # (1, V)
        first = next_token_law(emission_distribution(q, p[:2]), (), 5)
        assert torch.allclose(first, p[0], rtol=0, atol=1e-12)
        accepted = sum(m for s, m in emission_distribution(q, p[:2]).items() if len(s) == 2)
        assert abs(accepted - p[0, x].item()) < 1e-12  # acceptance = p(x)
        if p[0, x] < 1:
            without_x = p[0].clone()
            without_x[x] = 0
            assert torch.allclose(residual_distribution(p[0], q[0]), without_x / (1 - p[0, x]), atol=1e-12)


def test_enumeration_shows_the_article_rule_is_biased_for_one_hot_q(device):
    """Resampling from p after a rejection favours the drafted token: p(x) + (1 - p(x)) p(x)."""
    model, prompt = small_model().to(device), ids(1, 2, 3, 1, 2).to(device)
    proposal = PromptLookupDrafter().draft(prompt, 1, vocab_size=5)
    p = target_distributions(model, prompt, proposal.tokens, SamplingConfig(1.0)).double().cpu()  # (2, V)
    p = p / p.sum(-1, keepdim=True)
    first = next_token_law(emission_distribution(proposal.probs.cpu(), p, rule="article"), (), 5)
    x, px = int(proposal.tokens[0]), p[0, int(proposal.tokens[0])].item()
    assert abs(first[x].item() - (px + (1 - px) * px)) < 1e-12
    assert 0.5 * (first - p[0]).abs().sum().item() > 0.05


def sample_continuations(model, prompt, sampling, runs, use_cache=True, device="cpu"):
    """`runs` 3-token continuations of speculative_generate with prompt lookup, the drafts accepted and drafted
    (model and prompt on `device`)."""
    model, prompt = model.to(device), prompt.to(device)
    generator = generator_on(device, 123)
    samples, accepted, drafted = [], 0, 0
    for _ in range(runs):
        out = speculative_generate(model, PromptLookupDrafter(), prompt, max_new_tokens=3, sampling=sampling,
                                   generator=generator, use_cache=use_cache)
        samples.append(tuple(out.sequences[0, prompt.size(1):].tolist()))
        accepted, drafted = accepted + out.stats.accepted_tokens, drafted + out.stats.drafted_tokens
    return samples, accepted, drafted


@pytest.mark.slow
@pytest.mark.parametrize("sampling, use_cache", [(SamplingConfig(1.0), True), (SamplingConfig(0.7, top_k=3), False)])
def test_sampling_matches_target_law(sampling, use_cache, device):
    """The joint law of the first 3 tokens equals the target's (chi-square, 2000 runs)."""
    model, prompt = small_model(), ids(1, 2, 3, 1, 2)
    law = exact_joint_law(model, prompt, sampling, 3, 5)  # the exact law, on the CPU
    samples, accepted, drafted = sample_continuations(model, prompt, sampling, 2000, use_cache, device)
    assert 0 < accepted < drafted  # acceptances and rejections both happened
    assert chi_square_pvalue(law, samples) > 1e-3


@pytest.mark.slow
def test_chi_square_rejects_the_article_rule(monkeypatch, device):
    """Power check: the same test fails when a rejection resamples from p instead of the residual."""
    model, prompt = small_model(), ids(1, 2, 3, 1, 2)
    law = exact_joint_law(model, prompt, SamplingConfig(1.0), 3, 5)
    def article_rule(tokens, q, p, generator, greedy=False, trusted=False):
        return accept_reject_article(tokens, q, p, generator)

    monkeypatch.setattr(decoder_module, "accept_reject", article_rule)
    samples, _, _ = sample_continuations(model, prompt, SamplingConfig(1.0), 2000, device=device)
    assert chi_square_pvalue(law, samples) < 1e-6


def repetitive_prompt(seed: int) -> torch.Tensor:
    """A random 8-token chunk three times, then its first 3 tokens: copying pays."""
    chunk = torch.randint(2, 48, (8,), generator=torch.Generator().manual_seed(seed))
    return torch.cat([chunk, chunk, chunk, chunk[:3]]).view(1, -1)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_matches_target_generate(family, seed, device):
    """Temperature 0: transformers' greedy output, with and without its own prompt lookup (float32)."""
    target = make_model(family, layers=3, seed=1).to(device)
    prompt = repetitive_prompt(seed).to(device)
    expected = target.generate(prompt, max_new_tokens=60, min_new_tokens=60, do_sample=False)
    try:
        hf_lookup = target.generate(prompt, max_new_tokens=60, min_new_tokens=60, do_sample=False,
                                    prompt_lookup_num_tokens=10, max_matching_ngram_size=3)
    except TypeError as error:  # transformers 4.56's lookup needs an EOS id: torch.isin(..., None)
        if "isin" not in str(error) or target.generation_config.eos_token_id is not None:
            raise
        hf_lookup = expected  # nothing of transformers' own lookup to compare at that version
    assert torch.equal(hf_lookup, expected)
    for use_cache in (True, False):
        out = speculative_generate(target, PromptLookupDrafter(), prompt, max_new_tokens=60, sampling=GREEDY,
                              use_cache=use_cache)
        assert torch.equal(out.sequences, expected)
        assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # both branches exercised


def test_stats_count_passes_and_actual_drafts():
    """One target pass per iteration, no draft pass; drafted counts the proposals, not K."""
    target = make_model("llama", layers=2, seed=1)
    out = speculative_generate(target, PromptLookupDrafter(num_draft_tokens=6), repetitive_prompt(3),
                          max_new_tokens=40, sampling=GREEDY)
    stats = out.stats
    assert stats.target_calls == stats.iterations and stats.draft_calls == 0
    assert stats.drafted_tokens == sum(len(r.drafted) for r in out.trace)
    assert all(len(r.drafted) <= 6 for r in out.trace)
    assert stats.tokens_per_target_call > 1
    # Nothing to copy: every iteration is a plain target step.
    plain = speculative_generate(target, PromptLookupDrafter(), torch.arange(2, 12).view(1, -1), max_new_tokens=1,
                            sampling=GREEDY)
    assert plain.stats.drafted_tokens == 0 and plain.stats.target_calls == 1


def test_same_seed_same_output():
    """Randomness comes only from the generator: same seed, same tokens and trace."""
    target = make_model("gpt2", layers=2, seed=1)

    def run(seed):
        return speculative_generate(target, PromptLookupDrafter(), repetitive_prompt(0), max_new_tokens=40,
                               sampling=SamplingConfig(1.0), generator=torch.Generator().manual_seed(seed))

    first, second, other = run(5), run(5), run(6)
    assert torch.equal(first.sequences, second.sequences)
    assert [r.emitted for r in first.trace] == [r.emitted for r in second.trace]
    assert not torch.equal(first.sequences, other.sequences)


@pytest.mark.parametrize("max_new_tokens", [0, 1, 2, 5, 13])
@pytest.mark.parametrize("sampling", [GREEDY, SamplingConfig(1.0)])
def test_exactly_max_new_tokens(max_new_tokens, sampling):
    """Never more, never fewer than max_new_tokens without an EOS, even with K = 10."""
    target = make_model("gpt2", layers=2, seed=1)
    prompt = repetitive_prompt(2)
    out = speculative_generate(target, PromptLookupDrafter(), prompt, max_new_tokens=max_new_tokens, sampling=sampling,
                          generator=torch.Generator().manual_seed(0))
    assert out.sequences.shape == (1, prompt.size(1) + max_new_tokens)
    assert out.stats.new_tokens == max_new_tokens


def test_stops_right_after_eos_inside_an_accepted_block():
    """An EOS accepted in the middle of a block ends generation; the drafts after it do not count."""
    target, drafter = make_model("llama", layers=2, seed=1), PromptLookupDrafter()
    prompt = repetitive_prompt(0)
    reference = autoregressive_generate(target, prompt, max_new_tokens=60, sampling=GREEDY).sequences[0]  # (n + 60,)
    # Greedy continues its own prefix: from reference[:m] it emits reference[m:]. Find a cut m
    # whose lookup drafts at least 2 tokens the target accepts, then more, and an EOS id that
    # the accepted drafts hold for the first time at block position j >= 1.
    cut = None
    for m in range(prompt.size(1) + 1, reference.numel() - 12):
        drafts, future = drafter.lookup(reference[None, :m], 10).tolist(), reference[m:].tolist()
        j = next((j for j in range(1, len(drafts) - 1)
                  if drafts[: j + 1] == future[: j + 1] and future[j] not in future[:j]), None)
        if j is not None:
            cut = m, j
            break
    assert cut is not None, "no block with an accepted EOS and drafts after it"
    m, j = cut
    eos = int(reference[m + j])
    out = speculative_generate(target, drafter, reference[None, :m], max_new_tokens=40, sampling=GREEDY,
                               eos_token_id=eos)
    assert out.sequences[0].tolist() == reference[: m + j + 1].tolist()
    last = out.trace[-1]
    assert len(out.trace) == 1 and last.emitted == last.drafted[: j + 1] and last.emitted[-1] == eos
    assert last.num_accepted == last.num_judged == j + 1 < len(last.drafted)
    assert out.stats.accepted_tokens == out.stats.new_tokens == j + 1


def test_bad_arguments_raise_errors():
    """Errors name the argument and what is allowed."""
    with pytest.raises(ValueError, match="max_ngram_size"):
        PromptLookupDrafter(max_ngram_size=0)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        PromptLookupDrafter(num_draft_tokens=0)
    with pytest.raises(ValueError, match="occurrence"):
        PromptLookupDrafter(occurrence="middle")
    with pytest.raises(ValueError, match="input_ids"):
        PromptLookupDrafter().draft(torch.tensor([1, 2, 1]), 3, vocab_size=5)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        PromptLookupDrafter().draft(ids(1, 2, 1), -1, vocab_size=5)
    with pytest.raises(ValueError, match="vocabulary"):
        PromptLookupDrafter().draft(ids(1, 7, 1), 3, vocab_size=5)
    target = make_model("gpt2", layers=1, seed=1)
    with pytest.raises(TypeError, match="draft_model must be .* or a Drafter"):
        speculative_generate(target, object(), ids(1, 2), max_new_tokens=3)
    with pytest.raises(ValueError, match="num_draft_tokens"):
        speculative_generate(target, PromptLookupDrafter(), ids(1, 2), max_new_tokens=3, num_draft_tokens=0)


# --- One protocol for both kinds of drafter ----------------------------------------------


def test_model_drafter_is_the_draft_model_path():
    """speculative_generate with a ModelDrafter equals the same call with the bare draft model."""
    target, draft = make_model("gpt2", layers=2, seed=1), make_model("gpt2", layers=1, seed=2)
    prompt = ids(3, 1, 4, 1, 5)
    for sampling in (GREEDY, SamplingConfig(1.0)):
        runs = []
        for wrap in (False, True):
            generator = torch.Generator().manual_seed(7)
            drafter = ModelDrafter(make_logits_source(draft, True), sampling, generator) if wrap else draft
            out = speculative_generate(target, drafter, prompt, max_new_tokens=12, num_draft_tokens=3,
                                       sampling=sampling, generator=generator)
            runs.append((out.sequences.tolist(), out.stats.drafted_tokens, out.stats.draft_calls))
        assert runs[0] == runs[1]
        assert runs[0][1] > 0 and runs[0][2] > 0


def test_drafter_default_k_and_counted_drafts():
    """None takes the drafter's own K; drafted_tokens counts only what a lookup proposed."""
    target = make_model("gpt2", layers=1, seed=1)
    prompt = repetitive_prompt(0)
    out = speculative_generate(target, PromptLookupDrafter(num_draft_tokens=6), prompt, max_new_tokens=20,
                               sampling=GREEDY)
    assert max(len(r.drafted) for r in out.trace) <= 6
    assert out.stats.drafted_tokens == sum(len(r.drafted) for r in out.trace)
    assert out.stats.draft_calls == 0
    assert is_drafter(PromptLookupDrafter()) and not is_drafter(target)
