"""The tree's fast path: rows of a tree pass are bitwise one-token steps (grouped eager
attention), greedy in bfloat16 on the prepared path is `generate`'s, the lean draft's tree
caches are exact, and confidence-shaped trees (`ConfidentShape`) keep the target's law."""

import pytest
import torch
from conftest import chi_square_pvalue, exact_joint_law, make_model, needs_bf16_packing, noisy_copy, torch_threads
from transformers import DynamicCache

import specdec_ref.trees.tree as tree_module
from specdec_ref import SamplingConfig
from specdec_ref.fast.batch_invariant import GROUPED, use_rowwise_attention
from specdec_ref.fast.lean import LeanForward
from specdec_ref.fast.packed import pack_linear_layers, packing_unsupported
from specdec_ref.fast.prepared import prepare
from specdec_ref.fast.static import StaticForward
from specdec_ref.kv_cache import forward_keywords
from specdec_ref.laws import small_random_pair
from specdec_ref.trees.forward import LeanTreeForward, TreeForward, tree_source
from specdec_ref.trees.tree import ConfidentShape, DraftTree, confident_counts, tree_speculative_generate

GREEDY = SamplingConfig(temperature=0.0)
WARM = SamplingConfig()
CAN_PACK = packing_unsupported(torch.nn.Linear(2, 2)) is None


def random_tree(widths: tuple[int, ...], root: int, seed: int) -> DraftTree:
    """A tree of shape `widths` with random tokens."""
    generator = torch.Generator().manual_seed(seed)
    tree, level = DraftTree.rooted(root), [0]
    for width in widths:
        nxt = []
        for node in level:
            for _ in range(width):
                tree.add(node, int(torch.randint(2, 48, (), generator=generator)))
                nxt.append(len(tree.tokens) - 1)
        level = nxt
    return tree


def step_logits(model, prompt: torch.Tensor, tokens: list[int]) -> torch.Tensor:
    """The logits after `tokens`, fed one token per pass after the prompt (as generate does)."""
    cache = {forward_keywords(model)[0]: DynamicCache(config=model.config)}  # cache= or past_key_values=
    logits = model(prompt, **cache, use_cache=True).logits[0, -1]
    for token in tokens:
        logits = model(torch.tensor([[token]]), **cache, use_cache=True).logits[0, -1]
    return logits


@needs_bf16_packing
@pytest.mark.skipif(not CAN_PACK, reason="this torch build cannot prepack linear layers")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("widths", [(3, 2, 1), (2, 2, 2)])
def test_tree_rows_are_bitwise_one_token_steps(widths, threads):
    """bfloat16, prepacked, grouped eager attention: each node's row of one tree pass equals,
    bit for bit, the step a sequential decoder takes at that node (its lineage fed one token at
    a time). Without `fast.tree_attention` the masked pass rounds differently."""
    model = make_model("llama", layers=2, seed=5).to(torch.bfloat16)
    pack_linear_layers(model)
    use_rowwise_attention(model, GROUPED)
    sequence = torch.randint(2, 48, (1, 30), generator=torch.Generator().manual_seed(1))
    tree = random_tree(widths, int(sequence[0, -1]), seed=2)
    with torch_threads(threads):
        source = TreeForward(model)
        rows = source.forward(sequence, tree, 0, len(tree.tokens))  # (N + 1, V)
        for node in range(len(tree.tokens)):
            lineage = [tree.tokens[k] for k in reversed(tree.lineage(node))][1:]  # below the root
            expected = step_logits(model, sequence, lineage)
            assert torch.equal(rows[node], expected), node


@pytest.mark.skipif(not CAN_PACK, reason="this torch build cannot prepack linear layers")
@pytest.mark.parametrize("shape", [(3, 2, 1), (2, 2, 1, 1), ConfidentShape((4, 4, 4), top=3)])
def test_prepared_bfloat16_greedy_is_generates(shape):
    """`fast.prepare`'s pair (bfloat16 where native, prepacked, grouped target, lean draft):
    the tree decoder returns `generate`'s greedy tokens on the prepared target, prompt after
    prompt, with accepted paths off the first child."""
    target = make_model("llama", layers=3, seed=1)
    draft = noisy_copy(target, noise=0.3, seed=3)
    target, draft = target.to(torch.bfloat16), draft.to(torch.bfloat16)
    fast = prepare(draft, target, dtype=torch.bfloat16)
    assert isinstance(fast.draft, LeanForward)
    off_first = 0
    for seed in range(4):
        prompt = torch.randint(2, 48, (1, 6), generator=torch.Generator().manual_seed(seed))
        expected = fast.target.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False)
        out = tree_speculative_generate(fast.target, fast.draft, prompt, max_new_tokens=40, widths=shape,
                                        sampling=GREEDY)
        assert torch.equal(out.sequences, expected), seed
        off_first += sum(1 for r in out.trace if r.path and r.path[0] != 1)
    assert off_first > 0


def test_lean_tree_caches_stay_exact_and_sample_as_the_model_does():
    """A LeanForward draft: after each step its compacted buffers give a fresh pass's logits
    (float32, 1e-5), and sampling emits the tokens the model-draft decoder emits (same seed)."""
    target = make_model("llama", layers=2, seed=1)
    draft = noisy_copy(target, noise=0.3, seed=3)
    prompt = torch.tensor([[5, 6, 7, 8]])
    lean_out = tree_speculative_generate(target, LeanForward(draft, max_length=128), prompt, max_new_tokens=40,
                                         widths=(3, 2), generator=torch.Generator().manual_seed(0))
    model_out = tree_speculative_generate(target, draft, prompt, max_new_tokens=40, widths=(3, 2),
                                          generator=torch.Generator().manual_seed(0))
    assert torch.equal(lean_out.sequences, model_out.sequences)
    assert any(r.path and r.path != list(range(1, len(r.path) + 1)) for r in lean_out.trace)
    # Step by step: the buffers after compaction against a fresh pass.
    source = LeanTreeForward(LeanForward(draft, max_length=128))
    sequence, generator = prompt, torch.Generator().manual_seed(1)
    target_source = TreeForward(target)
    for _ in range(8):
        sequence, record, _ = tree_module.tree_speculative_step(target_source, source, sequence, (3, 2), WARM,
                                                               generator)
        kept = source.cached_length
        logits = source.forward(sequence, DraftTree.rooted(int(sequence[0, -1])), 0, 1)[0]
        assert torch.allclose(logits, draft(sequence).logits[0, -1], atol=1e-5)
        source.keep(list(range(kept)))


@pytest.mark.parametrize("family", ["gpt2", "llama"])
def test_a_static_draft_grows_trees_as_the_model_does(family, device):
    """A StaticForward draft (whole-buffer mask; CUDA graphs on a GPU): the tree decoder emits
    the model draft's tokens (same seed), and after compaction a chain pass (a graph replay on
    a GPU) gives a fresh pass's logits (float32, 1e-4)."""
    target = make_model(family, layers=2, seed=1).to(device)
    draft = noisy_copy(target, noise=0.3, seed=3)
    prompt = torch.tensor([[5, 6, 7, 8]], device=device)
    static = StaticForward(draft, max_length=128, static_shapes=True)
    out = tree_speculative_generate(target, static, prompt, max_new_tokens=30, widths=(3, 2),
                                    generator=torch.Generator(device).manual_seed(0))
    model_out = tree_speculative_generate(target, draft, prompt, max_new_tokens=30, widths=(3, 2),
                                          generator=torch.Generator(device).manual_seed(0))
    assert torch.equal(out.sequences, model_out.sequences)
    assert any(r.path and r.path != list(range(1, len(r.path) + 1)) for r in out.trace)
    sequence = out.sequences
    assert static.length < sequence.size(1)
    for end in range(static.length + 1, sequence.size(1) + 1):  # one token at a time
        logits = static.last_logits(sequence[:, :end], 1)[0]
        assert torch.allclose(logits, draft(sequence[:, :end]).logits[0, -1], atol=1e-4), end


def test_lean_tree_masks_a_one_node_level():
    """A level of one node below a level of three (ConfidentShape((3, 1, 1, 1))'s shape): the
    lean pass still masks its parent's siblings, so its logits are TreeForward's (1e-5)."""
    model = make_model("llama", layers=2, seed=1)
    sequence = torch.tensor([[5, 6, 7, 8]])
    tree = DraftTree.rooted(8)
    for parent, token in [(0, 11), (0, 12), (0, 13), (2, 14), (4, 15), (5, 16)]:
        tree.add(parent, token)
    lean, plain = LeanTreeForward(LeanForward(model, max_length=64)), TreeForward(model)
    for first, last in [(0, 1), (1, 4), (4, 5), (5, 6), (6, 7)]:  # level by level, as drafting feeds it
        expected = plain.forward(sequence, tree, first, last)
        assert torch.allclose(lean.forward(sequence, tree, first, last), expected, atol=1e-5), (first, last)


def test_a_lean_draft_equal_to_the_target_accepts_every_draft():
    """Draft = target through LeanForward, one-node levels below wider ones: every drafted child
    the target judges is accepted, and the tokens are generate's."""
    target = make_model("llama", layers=2, seed=1)
    prompt = torch.tensor([[3, 4, 5, 6, 7]])
    expected = target.generate(prompt, max_new_tokens=60, min_new_tokens=60, do_sample=False)
    out = tree_speculative_generate(target, LeanForward(target, max_length=128), prompt, max_new_tokens=60,
                                    widths=ConfidentShape((3, 1, 1, 1), top=3), sampling=GREEDY)
    assert torch.equal(out.sequences, expected)
    assert out.stats.accepted_tokens == out.stats.judged_tokens > 30


@pytest.mark.parametrize("widths", [(3, 2, 1), ConfidentShape((4, 4, 4), top=3)])
def test_a_lean_draft_fills_its_cache_without_running_past_it(widths):
    """A LeanForward of 64 columns, a 50-token prompt, 14 new tokens: the tree's nodes take slots
    past the committed tokens, so near the end it grows shallower; greedy gives generate's tokens."""
    target = make_model("llama", layers=2, seed=1)
    draft = noisy_copy(target, noise=0.3, seed=3)
    prompt = torch.randint(2, 48, (1, 50), generator=torch.Generator().manual_seed(0))
    expected = target.generate(prompt, max_new_tokens=14, min_new_tokens=14, do_sample=False)
    out = tree_speculative_generate(target, LeanForward(draft, max_length=64), prompt, max_new_tokens=14,
                                    widths=widths, sampling=GREEDY)
    assert torch.equal(out.sequences, expected)
    sampled = tree_speculative_generate(target, LeanForward(draft, max_length=64), prompt, max_new_tokens=14,
                                        widths=widths, generator=torch.Generator().manual_seed(0))
    assert sampled.sequences.shape == (1, 64)


def test_a_lean_draft_too_short_for_the_request_is_refused_up_front():
    """Prompt + max_new_tokens past the LeanForward's max_length: a ValueError naming it, before any pass."""
    target = make_model("llama", layers=2, seed=1)
    lean = LeanForward(noisy_copy(target, noise=0.3, seed=3), max_length=64)
    calls = []
    target.register_forward_pre_hook(lambda *_: calls.append(1))
    prompt = torch.randint(2, 48, (1, 50), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="draft_model holds at most max_length=64 tokens.*need 65"):
        tree_speculative_generate(target, lean, prompt, max_new_tokens=15, widths=(3, 2, 1), sampling=GREEDY)
    assert not calls and lean.forward_calls == 0


def test_confident_counts_give_the_budget_to_the_most_confident():
    """Two nodes: the confident one (score 0.9, its top token 0.8) gets most children."""
    confidence = torch.tensor([[0.8, 0.1, 0.05, 0.05], [0.4, 0.3, 0.2, 0.1]], dtype=torch.float64)
    scores = torch.tensor([0.9, 0.5], dtype=torch.float64)
    # Worth: node 0: .72 .09 .045 .045; node 1: .2 .15 .1 .05.
    assert confident_counts(confidence, scores, budget=3, top=4) == [1, 2]
    assert confident_counts(confidence, scores, budget=5, top=2) == [2, 2]  # at most `top` each
    assert confident_counts(confidence, scores, budget=1, top=4) == [1, 0]


@pytest.mark.parametrize("shape", [ConfidentShape((3, 3), top=2), ConfidentShape((2, 2, 2), top=3)])
def test_confident_shape_greedy_matches_generate(close_pair, shape):
    """float32, any family: the confidence-shaped tree's greedy tokens are generate's."""
    target, draft = close_pair
    prompt = torch.tensor([[3, 4, 5, 6, 7]])
    expected = target.generate(prompt, max_new_tokens=50, min_new_tokens=50, do_sample=False)
    out = tree_speculative_generate(target, draft, prompt, max_new_tokens=50, widths=shape, sampling=GREEDY)
    assert torch.equal(out.sequences, expected)
    sizes = {len(r.drafted) for r in out.trace}
    assert max(sizes) <= sum(shape.levels)


def pruned_draft_tree(draft, sequence, widths, sampling, generator=None, children="sampled"):
    """EAGLE-2's rerank, done wrong for sampling: draw the root's children, then drop every
    child but the first whose own q is below 0.1 (its presence now depends on its draw)."""
    tree = tree_module.original_draft_tree(draft, sequence, widths, sampling, generator, children)
    kept = DraftTree.rooted(tree.tokens[0])
    kept.q = tree.q[:1]
    for node in tree.children[0]:
        if node == tree.children[0][0] or float(tree.q[0][tree.tokens[node]]) >= 0.1:
            kept.add(0, tree.tokens[node])
    return kept


@pytest.mark.slow
def test_confident_shape_sampling_matches_target_law():
    """The joint law of the first 3 tokens is the target's (chi-square) with a confidence-shaped tree."""
    vocab = 6
    target, draft = small_random_pair(vocab, seed=0)
    prompt = torch.tensor([[0, 1]])
    law = exact_joint_law(target, prompt, WARM, 3, vocab)
    generator = torch.Generator().manual_seed(5)
    samples, shapes = [], set()
    for _ in range(1200):
        out = tree_speculative_generate(target, draft, prompt, max_new_tokens=3, widths=ConfidentShape((4, 3), top=4),
                                        sampling=WARM, generator=generator)
        samples.append(tuple(out.sequences[0, 2:].tolist()))
        shapes.add(tuple(out.trace[0].parents))
    assert len(shapes) > 1  # the shape followed the draft's confidence
    assert chi_square_pvalue(law, samples) > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["exact", "pruned"])
def test_pruning_children_by_their_drawn_confidence_is_biased(monkeypatch, variant):
    """The first token's law under a root with 4 children (chi-square, 1500 runs): the target's,
    unless children are dropped for their own drawn q (enumerated distance 0.11 on this pair)."""
    vocab = 6
    target, draft = small_random_pair(vocab, seed=4, init_range=0.2)
    prompt = torch.tensor([[0, 1]])
    law = exact_joint_law(target, prompt, WARM, 1, vocab)
    if variant == "pruned":
        monkeypatch.setattr(tree_module, "original_draft_tree", tree_module.draft_tree, raising=False)
        monkeypatch.setattr(tree_module, "draft_tree", pruned_draft_tree)
    generator = torch.Generator().manual_seed(7)
    samples = []
    for _ in range(1500):
        out = tree_speculative_generate(target, draft, prompt, max_new_tokens=2, widths=ConfidentShape((4,), top=4),
                                        sampling=WARM, generator=generator)
        samples.append(tuple(out.sequences[0, 2:3].tolist()))
    p_value = chi_square_pvalue(law, samples)
    assert p_value > 1e-3 if variant == "exact" else p_value < 1e-6


@pytest.mark.parametrize("levels, top", [((), 2), ((2, 0), 2), ((2,), 0), ((1.5,), 2)])
def test_bad_confident_shapes_raise(levels, top):
    with pytest.raises(ValueError, match="ConfidentShape"):
        ConfidentShape(levels, top)


def test_a_tree_source_must_be_a_model_or_a_lean_forward():
    with pytest.raises(TypeError, match="LeanForward"):
        tree_source(torch.nn.Linear(2, 2))
    target = make_model("llama", layers=1, seed=1)
    with pytest.raises(TypeError, match="LeanForward"):
        tree_speculative_generate(target, torch.nn.Linear(2, 2), torch.tensor([[1]]), max_new_tokens=2)
