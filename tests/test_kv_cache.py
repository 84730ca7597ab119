"""Both KV caches are rolled back exactly, in every way an iteration can end."""

import pytest
import torch
from conftest import generator_on, make_model, noisy_copy, through

from specdec_ref import (
    HeuristicDraftLength,
    ModelBasedDraftLength,
    SamplingConfig,
    autoregressive_generate,
    speculative_generate,
)
from specdec_ref.decoder import speculative_step
from specdec_ref.kv_cache import CachedForward, FullForward

GREEDY = SamplingConfig(temperature=0.0)


@pytest.mark.parametrize("family", ["gpt2", "llama"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_cached_and_uncached_greedy_are_identical(family, k, device):
    """300+ new tokens: the cached decoder emits exactly what the cache-free one does."""
    target = make_model(family, layers=2, seed=1)
    draft = noisy_copy(target, noise=0.3, seed=3).to(device)
    target = target.to(device)
    prompt = torch.tensor([[7, 8, 9]], device=device)
    kwargs = {"max_new_tokens": 320, "num_draft_tokens": k, "sampling": GREEDY}
    cached = speculative_generate(target, draft, prompt, use_cache=True, **kwargs)
    uncached = speculative_generate(target, draft, prompt, use_cache=False, **kwargs)
    assert torch.equal(cached.sequences, uncached.sequences)
    assert cached.sequences.size(1) == 3 + 320


def assert_cache_matches_fresh_pass(source: CachedForward, sequence: torch.Tensor) -> None:
    """The cache holds a prefix of `sequence` missing (at least) its last token, and the
    logits it gives for the next token equal a fresh pass over the whole sequence."""
    assert source.cached_length <= sequence.size(1) - 1
    cached = source.last_logits(sequence, 1)
    fresh = FullForward(source.model).last_logits(sequence, 1)
    assert torch.allclose(cached, fresh, atol=1e-5), (cached - fresh).abs().max()
    source.rollback(sequence.size(1) - 1)  # undo the check's own step


def cached_source(path: str, model):
    """The model's cache on `path`: a `CachedForward`, or the fast path's `StaticForward`."""
    if path == "models":
        return CachedForward(model)
    from specdec_ref.fast import StaticForward

    return StaticForward(model, max_length=64, static_shapes=True)


def run_step(target_model, draft_model, k, *, eos=frozenset(), steps=1, sampling=GREEDY, device="cpu",
             path="models"):
    """Run `steps` iterations from a fixed prompt; return the caches, sequence and last record."""
    target, draft = cached_source(path, target_model), cached_source(path, draft_model)
    sequence = torch.tensor([[5, 6, 7, 8]], device=device)
    generator = generator_on(device, 0)
    for _ in range(steps):
        sequence, record, _ = speculative_step(target, draft, sequence, k, sampling, generator, set(eos))
    return target, draft, sequence, record


@pytest.mark.parametrize("path", ["models", "static"])  # the prepared path's parts: these and test_lean
@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_rollback_restores_logits_in_every_case(family, device, path):
    """0 accepted, some accepted, all accepted + bonus, EOS inside the block, K = 0, on every path."""
    target_model = make_model(family, layers=2, seed=1)
    noisy = noisy_copy(target_model, noise=0.1, seed=3).to(device)  # the noise is drawn on the CPU
    target_model = target_model.to(device)
    seen = set()
    cases = {
        "none accepted": (make_model(family, layers=1, seed=9).to(device), 4, frozenset()),
        "some accepted": (noisy, 6, frozenset()),
        "all accepted + bonus": (target_model, 4, frozenset()),
        "budget end (K = 0)": (target_model, 0, frozenset()),
    }
    for name, (draft_model, k, eos) in cases.items():
        for steps in (1, 3, 5):
            target, draft, sequence, record = run_step(target_model, draft_model, k, eos=eos, steps=steps,
                                                       device=device, path=path)
            seen.add((name, record.num_accepted == k, record.num_accepted == 0))
            assert_cache_matches_fresh_pass(target, sequence)
            assert_cache_matches_fresh_pass(draft, sequence)
    # EOS inside an accepted block: the EOS is the 2nd of 4 accepted drafts.
    _, _, sequence, _ = run_step(target_model, target_model, 4, device=device, path=path)
    eos = {int(sequence[0, 5])}
    target, draft, sequence, record = run_step(target_model, target_model, 4, eos=eos, device=device, path=path)
    assert record.emitted[-1] in eos and len(record.emitted) == 2 and len(record.drafted) == 4
    assert record.num_accepted == record.num_judged == 2  # the drafts after the EOS do not count
    assert_cache_matches_fresh_pass(target, sequence)
    assert_cache_matches_fresh_pass(draft, sequence)
    # The cases really did cover: a block with no acceptance, a partial one, a full one.
    assert ("none accepted", False, True) in seen
    assert any(name == "some accepted" and not full and not none for name, full, none in seen)
    assert ("all accepted + bonus", True, False) in seen


def test_budget_end_inside_a_block_leaves_consistent_caches(device, path):
    """max_new_tokens reached mid-block: K shrinks, output length is exact, caches agree."""
    target = make_model("llama", layers=2, seed=1).to(device)
    prompt = torch.tensor([[5, 6]], device=device)
    route = through(path, target, target, max_length=9, sampling=GREEDY)
    out = speculative_generate(route.target, route.draft, prompt, max_new_tokens=7, num_draft_tokens=4,
                               sampling=GREEDY)
    # Perfect draft: blocks of K + 1 = 5 tokens, then the budget allows only K = 1.
    assert [len(r.emitted) for r in out.trace] == [5, 2]
    assert [len(r.drafted) for r in out.trace] == [4, 1]
    reference = autoregressive_generate(route.target_model, prompt, max_new_tokens=7, sampling=GREEDY)
    assert torch.equal(out.sequences, reference.sequences)


def test_cached_sampling_is_reproducible_and_uses_fewer_flops():
    """Same seed, same tokens with or without cache; the cache feeds each token once."""
    target = make_model("gpt2", layers=2, seed=1)
    draft = noisy_copy(target, noise=0.3, seed=3)
    prompt = torch.tensor([[5, 6, 7]])
    runs = [speculative_generate(target, draft, prompt, max_new_tokens=40, generator=torch.Generator().manual_seed(4),
                                 use_cache=use_cache) for use_cache in (True, False)]
    assert torch.equal(runs[0].sequences, runs[1].sequences)
    assert runs[0].stats.target_calls == runs[1].stats.target_calls


@pytest.mark.parametrize(
    "schedule",
    [lambda: HeuristicDraftLength(k=2, min_k=1, max_k=6), lambda: ModelBasedDraftLength(cost_ratio=0.1, max_k=6)],
)
def test_adaptive_draft_length_stays_in_bounds_and_exact(schedule, device):
    """Adaptive K stays within [min_k, max_k] and greedy output is still the target's."""
    target = make_model("gpt2", layers=2, seed=1)
    draft = noisy_copy(target, noise=0.2, seed=3).to(device)
    target = target.to(device)
    prompt = torch.tensor([[3, 4]], device=device)
    out = speculative_generate(target, draft, prompt, max_new_tokens=120, num_draft_tokens=schedule(),
                               sampling=GREEDY)
    reference = target.generate(prompt, max_new_tokens=120, min_new_tokens=120, do_sample=False)
    assert torch.equal(out.sequences, reference)
    ks = [len(r.drafted) for r in out.trace[:-2]]  # the last blocks may shrink to fit the budget
    assert min(ks) >= 1 and max(ks) <= 6 and len(set(ks)) > 1


def test_heuristic_schedule_follows_its_rule():
    """+2 after a full block, -1 after a rejection, clamped to the bounds."""
    schedule = HeuristicDraftLength(k=3, min_k=2, max_k=6)
    for drafted, accepted, expected in [(3, 3, 5), (5, 5, 6), (6, 1, 5), (5, 0, 4), (4, 0, 3), (3, 0, 2), (2, 0, 2)]:
        schedule.update(drafted, accepted)
        assert schedule.next_k() == expected


def test_heuristic_schedule_ignores_a_fully_accepted_short_block():
    """A block cut short by the budget (or K = 0) tested fewer than K drafts: no +2; a rejection still -1."""
    schedule = HeuristicDraftLength(k=5, min_k=1, max_k=16)
    for drafted, accepted, expected in [(3, 3, 5), (0, 0, 5), (3, 1, 4), (4, 4, 6)]:
        schedule.update(drafted, accepted)
        assert schedule.next_k() == expected


def test_heuristic_schedule_sees_the_budget_cut_block_as_short():
    """Perfect draft, 17 tokens: K = 2, 4, 6 fill 15, the budget allows K = 1, and K stays 8."""
    target = make_model("llama", layers=2, seed=1)
    schedule = HeuristicDraftLength(k=2, min_k=1, max_k=16)
    out = speculative_generate(target, target, torch.tensor([[5, 6]]), max_new_tokens=17, num_draft_tokens=schedule,
                               sampling=GREEDY)
    assert [len(r.drafted) for r in out.trace] == [2, 4, 6, 1]
    assert all(r.num_accepted == len(r.drafted) for r in out.trace)
    assert schedule.k == 8  # transformers' rule would have moved on to 10
