"""Tree drafts: the sibling rule emits p, the tree decoder reproduces the target, its caches stay exact."""

import functools

import pytest
import torch
from conftest import chi_square_pvalue, exact_joint_law, generator_on, make_model
from scipy.stats import chisquare
from transformers import DynamicCache

import specdec_ref.trees.tree as tree_module
from specdec_ref import SamplingConfig, speculative_generate
from specdec_ref.audit_tokens import audit_every_token
from specdec_ref.kv_cache import forward_keywords
from specdec_ref.laws import law_tv, small_random_pair, target_law
from specdec_ref.rejection import residual_distribution
from specdec_ref.trees.tree import DraftTree, TreeForward, tree_speculative_generate, tree_speculative_step
from specdec_ref.trees.verify import (
    draw_children,
    one_hot_outcomes,
    one_hot_step,
    sibling_law,
    sibling_step,
    tree_law,
    verify_tree,
    without,
)

GREEDY = SamplingConfig(temperature=0.0)
WARM = SamplingConfig()


def random_pairs(count: int, vocab: int, seed: int = 0):
    """Random (p, q) float64 pairs, peaked, with zeros on either side (both keep some mass)."""
    generator = torch.Generator().manual_seed(seed)
    pairs = []
    while len(pairs) < count:
        p, q = (torch.rand(vocab, generator=generator, dtype=torch.float64) ** 3 for _ in range(2))
        p[torch.rand(vocab, generator=generator) < 0.3] = 0
        q[torch.rand(vocab, generator=generator) < 0.3] = 0
        if p.sum() > 0 and q.sum() > 0:
            pairs.append((p / p.sum(), q / q.sum()))
    return pairs


@pytest.mark.parametrize("width", [1, 2, 3])
def test_sibling_rule_emits_p_exactly(width):
    """By enumeration over every draw without replacement: the emitted token follows p to 1e-12."""
    for p, q in random_pairs(60, vocab=5, seed=width) + [(torch.tensor([0.5, 0.5, 0.0]).double(),
                                                          torch.tensor([0.0, 0.0, 1.0]).double())]:
        law = sibling_law(p, q, width)
        assert (law - p).abs().max() < 1e-12, (p, q, law)


@pytest.mark.parametrize("rule", ["q", "article"])
def test_enumeration_shows_the_biased_sibling_rules(rule):
    """Judging distinct children against q instead of q_i, or resampling from p: far from p."""
    worst = max(0.5 * float((sibling_law(p, q, 2, rule=rule) - p).abs().sum()) for p, q in random_pairs(60, 5))
    assert worst > 0.1


@pytest.mark.parametrize("sampling", [WARM, SamplingConfig(0.7, top_k=3)])
def test_tree_law_is_the_target_law(sampling):
    """By enumeration on a random pair: the tree decoder's first 3 tokens follow the target's law to 1e-12
    for several shapes (budget cuts included); the biased rules do not."""
    target, draft = small_random_pair(5, seed=1)
    prompt = torch.tensor([[0, 1]])
    expected = target_law(target, prompt, sampling, 3)
    for widths in [(1,), (2, 2), (3, 1), (2, 1, 1), (4, 3)]:
        law = tree_law(target, draft, prompt, widths, sampling=sampling, num_tokens=3)
        assert max(abs(law.get(o, 0.0) - expected.get(o, 0.0)) for o in set(law) | set(expected)) < 1e-12
        assert law_tv(tree_law(target, draft, prompt, widths, sampling=sampling, num_tokens=3, rule="article"),
                      expected) > 0.005
        if max(widths) > 1:  # with one child, q_1 = q: the two rules agree
            assert law_tv(tree_law(target, draft, prompt, widths, sampling=sampling, num_tokens=3, rule="q"),
                          expected) > 0.005


def test_draw_children_is_sampling_without_replacement():
    """Gumbel-top-k gives the sequential law: P(x1, x2) = q(x1) q(x2) / (1 - q(x1)) (chi-square)."""
    q = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    generator = torch.Generator().manual_seed(0)
    draws = draw_children(q.expand(20000, -1), 2, generator)
    assert all(len(kids) == 2 and 4 not in kids for kids in draws)
    law = {(a, b): float(q[a] * without(q, [a])[b]) for a in range(4) for b in range(4) if a != b}
    assert chi_square_pvalue(law, [tuple(kids) for kids in draws]) > 1e-3
    assert draw_children(torch.tensor([[0.0, 1.0, 0.0]]), 3, generator) == [[1]]  # fewer tokens than w


@pytest.mark.parametrize("rule", ["exact", "q"])
def test_sibling_step_samples_its_enumerated_law(rule):
    """The implementation, not only the enumeration: 6,000 draws of the rule follow sibling_law."""
    p = torch.tensor([0.04, 0.0, 0.2, 0.06, 0.7])
    q = torch.tensor([0.3, 0.2, 0.0, 0.45, 0.05])
    generator = torch.Generator().manual_seed(1)
    counts = torch.zeros(5)
    for kids in draw_children(q.expand(6000, -1), 3, generator):
        counts[sibling_step(p, q, kids, generator, rule=rule)[1]] += 1
    law = sibling_law(p, q, 3, rule=rule)
    assert chisquare(counts[law > 0], 6000 * law[law > 0]).pvalue > 1e-3
    assert torch.allclose(law, p.double(), atol=1e-9) == (rule == "exact")


def test_verify_tree_walks_the_greedy_path():
    """Greedy: follow the child equal to the target's argmax; emit the argmax where none is."""
    tree = DraftTree.rooted(9)
    for parent, token in [(0, 3), (0, 4), (1, 5), (2, 6), (2, 7)]:
        tree.add(parent, token)
    p = torch.nn.functional.one_hot(torch.tensor([4, 0, 7, 0, 0, 0]), 10).float()  # argmax per node
    path, last, tried = verify_tree(tree.tokens, tree.children, p, p[:3], greedy=True)
    assert (path, last, tried) == ([2, 5], 0, [2, 2, 0])


def test_greedy_chain_shaped_tree_is_the_chain(close_pair):
    """widths (1,) * K is the chain: the same blocks as speculative_generate with K drafts."""
    target, draft = close_pair
    prompt = torch.tensor([[3, 4, 5]])
    chain = speculative_generate(target, draft, prompt, max_new_tokens=40, num_draft_tokens=3, sampling=GREEDY)
    tree = tree_speculative_generate(target, draft, prompt, max_new_tokens=40, widths=(1, 1, 1), sampling=GREEDY)
    assert [r.emitted for r in tree.trace] == [r.emitted for r in chain.trace]
    assert tree.stats.target_calls == chain.stats.target_calls


@pytest.mark.parametrize("widths", [(1,), (2, 2), (3, 2, 1), (4,)])
def test_greedy_matches_target_generate(close_pair, widths, device):
    """Temperature 0: token for token transformers' greedy generate, with paths off the first child."""
    target, draft = (model.to(device) for model in close_pair)
    prompt = torch.tensor([[3, 4, 5, 6, 7]], device=device)
    expected = target.generate(prompt, max_new_tokens=60, min_new_tokens=60, do_sample=False)
    out = tree_speculative_generate(target, draft, prompt, max_new_tokens=60, widths=widths, sampling=GREEDY)
    assert torch.equal(out.sequences, expected)
    assert 0 < out.stats.accepted_tokens < out.stats.judged_tokens
    if max(widths) > 1:  # some accepted child was not its parent's first
        assert any(r.path and r.path[0] != 1 for r in out.trace)


@pytest.mark.slow
@pytest.mark.parametrize("rule", ["exact", "q", "article"])
def test_sampling_matches_target_law(monkeypatch, rule, device):
    """The joint law of the first 3 tokens is the target's (chi-square); the biased sibling rules fail it."""
    vocab = 6
    target, draft = small_random_pair(vocab, seed=0)
    prompt = torch.tensor([[0, 1]])
    law = exact_joint_law(target, prompt, WARM, 3, vocab)  # on the CPU
    target, draft, prompt = target.to(device), draft.to(device), prompt.to(device)
    monkeypatch.setattr(tree_module, "verify_tree", functools.partial(verify_tree, rule=rule))
    generator = generator_on(device, 5)
    samples, accepted = [], 0
    for _ in range(1200 if rule == "exact" else 300):
        out = tree_speculative_generate(target, draft, prompt, max_new_tokens=3, widths=(3, 2), sampling=WARM,
                                        generator=generator)
        samples.append(tuple(out.sequences[0, 2:].tolist()))
        accepted += out.stats.accepted_tokens
    assert 0 < accepted < 2 * len(samples)  # acceptances and rejections both happened
    p_value = chi_square_pvalue(law, samples)
    assert p_value > 1e-3 if rule == "exact" else p_value < 1e-6


def assert_cache_is_fresh(forward: TreeForward, sequence: torch.Tensor) -> None:
    """The compacted cache holds a fresh pass's keys and values over the tokens it keeps,
    and gives the next token's logits of a fresh pass over the whole sequence (1e-5)."""
    kept = forward.cached_length
    assert 0 < kept <= sequence.size(1) - 1
    fresh = DynamicCache(config=forward.model.config)
    forward.model(sequence[:, :kept], **{forward_keywords(forward.model)[0]: fresh}, use_cache=True)
    for layer, expected in zip(forward.cache.layers, fresh.layers, strict=True):
        assert torch.allclose(layer.keys, expected.keys, atol=1e-5)
        assert torch.allclose(layer.values, expected.values, atol=1e-5)
    logits = forward.forward(sequence, DraftTree.rooted(int(sequence[0, -1])), 0, 1)[0]
    assert torch.allclose(logits, forward.model(sequence).logits[0, -1], atol=1e-5)
    forward.keep(list(range(kept)))  # undo the check's own pass


@pytest.mark.parametrize("widths", [(3, 2, 1), (2, 2, 2)])
def test_compacted_caches_match_a_fresh_pass(close_pair, widths, device):
    """After every step (none, some or all accepted, paths off the first child), both caches are exact."""
    target, draft = (TreeForward(model.to(device)) for model in close_pair)
    sequence = torch.tensor([[5, 6, 7, 8]], device=device)
    generator = generator_on(device, 0)
    seen = set()
    for _ in range(12):
        sequence, record, _ = tree_speculative_step(target, draft, sequence, widths, WARM, generator)
        seen.add((record.num_accepted, record.path != list(range(1, record.num_accepted + 1))))
        assert_cache_is_fresh(target, sequence)
        assert_cache_is_fresh(draft, sequence)
    counts = {count for count, _ in seen}
    assert 0 in counts and len(counts) > 1 and any(scattered for _, scattered in seen)


def test_stops_right_after_eos_inside_an_accepted_path():
    """A perfect draft accepts whole paths; an EOS in the middle of one ends generation after it."""
    target = make_model("llama", layers=2, seed=1)
    prompt = torch.tensor([[3, 4, 5]])
    reference = target.generate(prompt, max_new_tokens=30, min_new_tokens=30, do_sample=False)[0, 3:].tolist()
    # Blocks of 4 tokens (depth 3 + bonus): an EOS first seen as the 2nd or 3rd token of a block.
    position = next(i for i in range(2, 30) if i % 4 in (1, 2) and reference[i] not in reference[:i])
    out = tree_speculative_generate(target, target, prompt, max_new_tokens=30, widths=(2, 2, 2), sampling=GREEDY,
                                    eos_token_id=reference[position])
    assert out.sequences[0, 3:].tolist() == reference[: position + 1]
    last = out.trace[-1]
    assert last.emitted[-1] == reference[position] and len(last.path) == len(last.emitted) == last.num_accepted
    assert last.num_judged == len(last.path)  # perfect draft: each first child accepted; none below the EOS


@pytest.mark.parametrize("max_new_tokens", [0, 1, 2, 5, 7, 13])
def test_exactly_max_new_tokens(close_pair, max_new_tokens):
    """Never more, never fewer tokens than max_new_tokens without an EOS."""
    target, draft = close_pair
    out = tree_speculative_generate(target, draft, torch.tensor([[4, 5]]), max_new_tokens=max_new_tokens,
                                    widths=(2, 2, 1), generator=torch.Generator().manual_seed(0))
    assert out.sequences.shape == (1, 2 + max_new_tokens) and out.stats.new_tokens == max_new_tokens


def test_budget_cuts_the_tree_depth():
    """A perfect draft, 7 tokens, widths (2, 2, 2): a block of 4, then a tree of depth 2 (3 tokens)."""
    target = make_model("gpt2", layers=2, seed=1)
    prompt = torch.tensor([[5, 6]])
    out = tree_speculative_generate(target, target, prompt, max_new_tokens=7, widths=(2, 2, 2), sampling=GREEDY)
    assert [len(r.emitted) for r in out.trace] == [4, 3]
    assert [len(r.drafted) for r in out.trace] == [14, 6]
    expected = target.generate(prompt, max_new_tokens=7, min_new_tokens=7, do_sample=False)
    assert torch.equal(out.sequences, expected)
    assert out.stats.target_calls == 2 and out.stats.draft_calls == 5


def test_every_token_audit_passes():
    """The every-token audit at its recommended size (32 runs of 64 tokens) passes the tree decoder."""
    target, draft = small_random_pair(64, seed=4, init_range=0.2, positions=512)
    prompt = torch.tensor([[1, 2, 3, 1, 2]])

    def generate(ids, generator):
        return tree_speculative_generate(target, draft, ids, max_new_tokens=64, widths=(2, 2), sampling=WARM,
                                         generator=generator)

    result = audit_every_token(generate, target, prompt, sampling=WARM, max_new_tokens=64, num_runs=32,
                               generator=torch.Generator().manual_seed(1))
    assert result.passed, result.summary()


@pytest.mark.parametrize("widths", [(), [0], (2, -1), "3", (1.5,), None])
def test_bad_widths_raise(widths):
    """widths must be a non-empty list of integers >= 1; the message names it."""
    target, draft = small_random_pair(5)
    with pytest.raises(ValueError, match="widths"):
        tree_speculative_generate(target, draft, torch.tensor([[0]]), max_new_tokens=2, widths=widths)


def test_bad_arguments_are_checked_as_the_chain_does():
    """The chain's argument checks (validation) apply: batch size, budget, sampling."""
    target, draft = small_random_pair(5)
    with pytest.raises(ValueError, match="batch size"):
        tree_speculative_generate(target, draft, torch.tensor([[0], [1]]), max_new_tokens=2)
    with pytest.raises(ValueError, match="max_new_tokens"):
        tree_speculative_generate(target, draft, torch.tensor([[0]]), max_new_tokens=-1)
    with pytest.raises(TypeError, match="sampling"):
        tree_speculative_generate(target, draft, torch.tensor([[0]]), max_new_tokens=2, sampling=1.0)


@pytest.mark.parametrize("sampling", [WARM, SamplingConfig(0.7, top_k=3)])
def test_top_k_children_are_exact(sampling):
    """EAGLE-2's trees, the draft's top-w tokens judged as point masses: by enumeration the
    first 3 tokens follow the target's law to 1e-12 for several shapes; judging the same
    children as draws from q (the sibling rule) would not be."""
    target, draft = small_random_pair(5, seed=1)
    prompt = torch.tensor([[0, 1]])
    expected = target_law(target, prompt, sampling, 3)
    for widths in [(1,), (2, 2), (3, 1), (4, 3)]:
        law = tree_law(target, draft, prompt, widths, sampling=sampling, num_tokens=3, children="top-k")
        assert max(abs(law.get(o, 0.0) - expected.get(o, 0.0)) for o in set(law) | set(expected)) < 1e-12
    p = torch.tensor([0.04, 0.0, 0.2, 0.06, 0.7]).double()
    q = torch.tensor([0.3, 0.2, 0.0, 0.45, 0.05]).double()
    accepted, corrected = one_hot_outcomes(p, q, 2)
    assert torch.allclose(accepted + corrected, p, atol=1e-12)
    assert accepted.nonzero().flatten().tolist() == [0, 3]  # q's top two tokens
    # The sibling rule on q's top two tokens, as if they had been drawn from q, is off.
    biased, p_i, reach = torch.zeros(5, dtype=torch.float64), p.clone(), 1.0
    for i, x in enumerate([3, 0]):
        q_i = without(q, [3, 0][:i])
        accept = min(1.0, float(p_i[x] / q_i[x]))
        biased[x] += reach * accept
        reach *= 1 - accept
        p_i = residual_distribution(p_i, q_i)
    biased += reach * p_i
    assert float((biased - p).abs().sum()) / 2 > 0.05


def test_one_hot_step_samples_its_enumerated_law():
    """The implementation: 6,000 draws of `one_hot_step` follow `one_hot_outcomes` (chi-square)."""
    p = torch.tensor([0.04, 0.0, 0.2, 0.06, 0.7])
    q = torch.tensor([0.3, 0.2, 0.0, 0.45, 0.05])
    generator = torch.Generator().manual_seed(2)
    counts = torch.zeros(5)
    for _ in range(6000):
        counts[one_hot_step(p, [3, 0, 1], generator)[1]] += 1
    accepted, corrected = one_hot_outcomes(p, q, 3)
    law = accepted + corrected
    assert chisquare(counts[law > 0], 6000 * law[law > 0]).pvalue > 1e-3


def test_children_must_be_named():
    target, draft = small_random_pair(5, seed=1)
    with pytest.raises(ValueError, match="children must be one of"):
        tree_speculative_generate(target, draft, torch.tensor([[0, 1]]), max_new_tokens=4, widths=(2,),
                                  children="top-p")
