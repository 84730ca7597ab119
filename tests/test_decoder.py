"""speculative_generate reproduces the target: greedy token for token, sampling in law."""

import copy

import pytest
import torch
from conftest import chi_square_pvalue, exact_joint_law, generator_on, make_model, noisy_copy, through

from specdec_ref import SamplingConfig, autoregressive_generate, speculative_generate
from specdec_ref.decoder import GenerationStats, close_block
from specdec_ref.sampling import logits_to_probs
from specdec_ref.verification import target_distributions

GREEDY = SamplingConfig(temperature=0.0)


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("seed", [0, 1])
def test_greedy_matches_target_generate(close_pair, k, seed, device, path):
    """Temperature 0: the same tokens as transformers' greedy generate, on every path (float32 as
    built; the prepared path's own dtype, its target's generate the reference)."""
    target, draft = (model.to(device) for model in close_pair)
    prompt = torch.randint(2, 48, (1, 5), generator=torch.Generator().manual_seed(seed)).to(device)
    route = through(path, target, draft, max_length=65, sampling=GREEDY)
    expected = route.target_model.generate(prompt, max_new_tokens=60, min_new_tokens=60, do_sample=False)
    out = speculative_generate(route.target, route.draft, prompt, max_new_tokens=60, num_draft_tokens=k,
                               sampling=GREEDY)
    assert torch.equal(out.sequences, expected)
    assert 0 < out.stats.accepted_tokens < out.stats.drafted_tokens  # both branches were exercised


def test_autoregressive_baseline_matches_generate(close_pair, device, path):
    """The baseline decoder is the target's own greedy decoding, on every path."""
    target = close_pair[0].to(device)
    prompt = torch.tensor([[3, 4, 5]], device=device)
    route = through(path, target, max_length=43)
    expected = route.target_model.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False)
    out = autoregressive_generate(route.target, prompt, max_new_tokens=40, sampling=GREEDY)
    assert torch.equal(out.sequences, expected)


@pytest.mark.parametrize(
    "sampling, use_cache, path",
    [
        (SamplingConfig(1.0), True, "models"),
        (SamplingConfig(1.0), False, "models"),
        (SamplingConfig(0.7, top_k=3), True, "models"),
        (SamplingConfig(1.0, top_p=0.8), True, "models"),
        (SamplingConfig(1.0), True, "static"),
        (SamplingConfig(0.7, top_k=3), True, "static"),
        (SamplingConfig(1.0), True, "prepared"),
        (SamplingConfig(0.7, top_k=3), True, "prepared"),
    ],
)
@pytest.mark.slow
def test_sampling_end_to_end_matches_target_law(sampling, use_cache, path, device):
    """The joint law of the first 3 generated tokens equals the target's (chi-square), on every path."""
    vocab = 5
    target = make_model("gpt2", layers=1, width=32, vocab=vocab, seed=7, init_range=0.5)
    draft = noisy_copy(target, noise=0.8, seed=8)
    prompt = torch.tensor([[1, 2]])
    target, draft, prompt = target.to(device), draft.to(device), prompt.to(device)
    generator = generator_on(device, 123)
    # One static cache for all 3000 runs: each run starts by emptying it.
    route = through(path, target, draft, max_length=5, sampling=sampling, generator=generator)
    # The exact law of the target as the path runs it (prepared: its dtype), on the CPU.
    law = exact_joint_law(copy.deepcopy(route.target_model).cpu(), prompt.cpu(), sampling, 3, vocab)
    samples, accepted = [], 0
    for _ in range(3000):
        out = speculative_generate(route.target, route.draft, prompt, max_new_tokens=3, num_draft_tokens=2,
                                   sampling=sampling, generator=generator, use_cache=use_cache)
        samples.append(tuple(out.sequences[0, 2:].tolist()))
        accepted += out.stats.accepted_tokens
    assert 0 < accepted < 3000 * 2  # acceptances and rejections both happened
    assert chi_square_pvalue(law, samples) > 1e-3


@pytest.mark.slow
def test_chi_square_rejects_the_draft_law(device):
    """Power check: sampling the draft alone fails the same end-to-end test."""
    vocab = 5
    target = make_model("gpt2", layers=1, width=32, vocab=vocab, seed=7, init_range=0.5)
    draft = noisy_copy(target, noise=0.8, seed=8)
    prompt = torch.tensor([[1, 2]])
    law = exact_joint_law(target, prompt, SamplingConfig(1.0), 3, vocab)  # the exact law, on the CPU
    draft, prompt = draft.to(device), prompt.to(device)
    generator = generator_on(device, 123)
    samples = [tuple(autoregressive_generate(draft, prompt, max_new_tokens=3, generator=generator)
                     .sequences[0, 2:].tolist()) for _ in range(3000)]
    assert chi_square_pvalue(law, samples) < 1e-6


def test_one_pass_verification_matches_incremental_passes(pair):
    """The K + 1 distributions of one pass equal K + 1 separate passes (float32)."""
    target, _ = pair
    prefix = torch.tensor([[5, 9, 2, 7]])
    drafts = torch.tensor([11, 3, 30, 8])
    sampling = SamplingConfig(0.9, top_k=20)
    p = target_distributions(target, prefix, drafts, sampling)  # (K + 1, V)
    assert p.shape == (5, 48)
    for i in range(5):
        sequence = torch.cat([prefix, drafts[:i].view(1, -1)], dim=1)
        one = logits_to_probs(target(sequence).logits[0, -1], sampling)
        assert torch.allclose(p[i], one, atol=1e-6)


@pytest.mark.parametrize("max_new_tokens", [0, 1, 2, 5, 7, 13])
@pytest.mark.parametrize("k", [1, 4])
def test_exactly_max_new_tokens(close_pair, max_new_tokens, k):
    """Never more, never fewer than max_new_tokens without an EOS."""
    target, draft = close_pair
    out = speculative_generate(target, draft, torch.tensor([[4, 5]]), max_new_tokens=max_new_tokens,
                               num_draft_tokens=k, generator=torch.Generator().manual_seed(0))
    assert out.sequences.shape == (1, 2 + max_new_tokens)
    assert out.stats.new_tokens == max_new_tokens


@pytest.mark.parametrize("emitted, accepted, eos, expected", [
    ([7, 8, 9], 2, set(), ([7, 8, 9], 2, 12, False)),  # a rejection's correction
    ([7, 8, 9, 6], 3, set(), ([7, 8, 9, 6], 3, 13, False)),  # a bonus token
    ([7, 8, 9], 2, {9}, ([7, 8, 9], 2, 12, True)),  # the correction is an EOS
    ([7, 8, 9], 2, {8}, ([7, 8], 2, 11, True)),  # an accepted EOS ends the block
    ([7, 8, 9], 2, {7, 8}, ([7], 1, 10, True)),  # the first EOS counts
    ([5], 0, {5}, ([5], 0, 10, True)),  # no drafts: one plain step
])
def test_close_block_keeps_prefix_and_accepted_drafts(emitted, accepted, eos, expected):
    """close_block cuts after the first EOS, counts no draft after it, and keeps
    all but the last emitted token in both caches (n = 10 before the block)."""
    block = close_block(emitted, accepted, 10, eos)
    assert (block.emitted, block.num_accepted, block.keep, block.hit_eos) == expected
    assert block.keep == 10 + len(block.emitted) - 1
    assert block.cut == (len(block.emitted) == block.num_accepted)


def test_stops_right_after_eos_inside_an_accepted_block():
    """An EOS accepted in the middle of a draft block ends generation right after it,
    and the drafts after it count neither as accepted nor as judged."""
    target = make_model("llama", layers=2, seed=1)
    prompt = torch.tensor([[3, 4, 5]])
    reference = target.generate(prompt, max_new_tokens=30, min_new_tokens=30, do_sample=False)[0, 3:].tolist()
    # Pick an EOS id that first appears as draft 2, 3 or 4 of a block: a perfect draft
    # accepts whole blocks of K = 5 (6 tokens each), so drafts follow the EOS in its block.
    position = next(i for i in range(2, 30) if i % 6 in (1, 2, 3) and reference[i] not in reference[:i])
    eos = reference[position]
    out = speculative_generate(target, target, prompt, max_new_tokens=30, num_draft_tokens=5,
                               sampling=GREEDY, eos_token_id=eos)
    assert out.sequences[0, 3:].tolist() == reference[: position + 1]
    last = out.trace[-1]
    assert last.emitted[-1] == eos and last.emitted == last.drafted[: len(last.emitted)]
    assert last.num_accepted == last.num_judged == len(last.emitted) < len(last.drafted)
    # Every accepted token is emitted; only the full blocks add a bonus token each.
    stats, full_blocks = out.stats, len(out.trace) - 1
    assert stats.accepted_tokens == stats.judged_tokens == stats.new_tokens - full_blocks
    assert stats.drafted_tokens == 5 * len(out.trace)


def test_acceptance_rate_is_not_alpha(close_pair):
    """acceptance_rate = accepted / drafted; per_token_acceptance (alpha's estimate) = accepted / judged,
    higher when K > 1 because drafts after a rejection are never judged."""
    target, draft = close_pair
    out = speculative_generate(target, draft, torch.tensor([[3, 4]]), max_new_tokens=60, num_draft_tokens=4,
                               generator=torch.Generator().manual_seed(0))
    stats = out.stats
    assert stats.judged_tokens == sum(r.num_judged for r in out.trace)
    assert stats.acceptance_rate == stats.accepted_tokens / stats.drafted_tokens
    assert stats.per_token_acceptance == stats.accepted_tokens / stats.judged_tokens
    assert 0 < stats.acceptance_rate < stats.per_token_acceptance < 1
    assert "alpha" not in GenerationStats.acceptance_rate.__doc__.split(":")[0]


@pytest.mark.parametrize(
    "change, match",
    [
        ({"input_ids": torch.tensor([[1, 2], [3, 4]])}, "batch size"),
        ({"input_ids": torch.empty(1, 0, dtype=torch.long)}, "empty"),
        ({"input_ids": torch.tensor([1, 2])}, "shape"),
        ({"num_draft_tokens": 0}, "num_draft_tokens"),
        ({"max_new_tokens": -1}, "max_new_tokens"),
        ({"max_new_tokens": 600}, "context length"),
        ({"input_ids": torch.tensor([[1, 99]])}, "input_ids must hold token ids"),
        ({"eos_token_id": -3}, "eos_token_id"),
        ({"input_ids": torch.tensor([[1, -4]])}, "got -4 at position 1"),
    ],
)
def test_bad_arguments_raise_value_errors(pair, change, match):
    """Every malformed argument is named in a ValueError before any model runs."""
    target, draft = pair
    kwargs = {"input_ids": torch.tensor([[1, 2]]), "max_new_tokens": 4, "num_draft_tokens": 2, **change}
    with pytest.raises(ValueError, match=match):
        speculative_generate(target, draft, **kwargs)


def test_mismatched_vocabularies_and_devices_are_refused():
    """Different vocabularies, or models on different devices, raise ValueError."""
    target = make_model("gpt2", vocab=48)
    with pytest.raises(ValueError, match="vocabulary"):
        speculative_generate(target, make_model("gpt2", vocab=40), torch.tensor([[1]]), max_new_tokens=2)
    meta_draft = make_model("gpt2", vocab=48).to("meta")
    with pytest.raises(ValueError, match="same device"):
        speculative_generate(target, meta_draft, torch.tensor([[1]]), max_new_tokens=2)


def test_temperature_errors_name_the_argument():
    """Sampling settings are checked where they are made."""
    with pytest.raises(ValueError, match="temperature"):
        SamplingConfig(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingConfig(top_p=0)
    with pytest.raises(ValueError, match="top_k"):
        SamplingConfig(top_k=0)


def test_non_finite_logits_raise_instead_of_emitting_garbage(pair):
    """A model whose logits are NaN is refused with a clear error at T = 1."""
    target, draft = pair
    broken = copy.deepcopy(target)
    with torch.no_grad():
        broken.get_output_embeddings().weight.fill_(float("nan"))
    prompt = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="non-finite"):
        speculative_generate(broken, draft, prompt, max_new_tokens=4,
                             generator=torch.Generator().manual_seed(0))
