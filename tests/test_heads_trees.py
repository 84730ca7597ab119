"""Draft heads growing a tree for the unchanged tree decoder (Medusa's, EAGLE's): greedy-equal,
exact, and EAGLE's chain the same drafts as its chain drafter."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model

from specdec_ref import SamplingConfig, speculative_generate
from specdec_ref.audit import audit
from specdec_ref.heads.drafters import EagleDrafter
from specdec_ref.heads.eagle import EagleHead
from specdec_ref.heads.features import FeatureSource
from specdec_ref.heads.medusa import MedusaHeads
from specdec_ref.heads.trees import EagleTreeSource, FeatureTreeForward, MedusaTreeSource
from specdec_ref.laws import target_law
from specdec_ref.trees.tree import tree_speculative_generate

GREEDY = SamplingConfig(temperature=0.0)


def medusa(model, num_heads: int = 3, scale: float = 0.5, seed: int = 0) -> MedusaHeads:
    """Random Medusa heads whose blocks are moved off the identity by `scale`."""
    torch.manual_seed(seed)
    heads = MedusaHeads.for_target(model, num_heads)
    with torch.no_grad():
        for block in heads.blocks:
            block.linear.weight.normal_(0, scale)
    return heads.eval()


def eagle(model, seed: int = 0) -> EagleHead:
    torch.manual_seed(seed)
    return EagleHead.for_target(model).eval()


def tree_draft(kind: str, model, source: FeatureTreeForward, **kwargs):
    if kind == "eagle":
        return EagleTreeSource(eagle(model, kwargs.get("seed", 0)), source)
    return MedusaTreeSource(medusa(model, **kwargs), source)


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
@pytest.mark.parametrize("widths", [(1, 1, 1), (2, 2, 1), (3, 1)])
def test_head_tree_greedy_is_the_targets_greedy(kind, widths):
    """Token for token the target's own greedy output, for chains and trees, twice over
    (the second call reuses the sources: a fresh sequence each call)."""
    model = make_model("llama", seed=21)
    source = FeatureTreeForward(model)
    draft = tree_draft(kind, model, source)
    prompt = torch.tensor([[5, 9, 2, 31, 7]])
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=30,
                              **GREEDY.generate_kwargs())
    for _ in range(2):
        out = tree_speculative_generate(source, draft, prompt, max_new_tokens=30, widths=widths,
                                        sampling=GREEDY)
        assert torch.equal(out.sequences, expected)
        if kind == "medusa":  # one head pass per round, except the first (a uniform q)
            # and a last round the budget leaves no room to draft in
            assert out.stats.target_calls - 2 <= out.stats.draft_calls <= out.stats.target_calls - 1


def test_eagle_chain_drafts_what_its_chain_drafter_drafts():
    """Widths (1,) * K through the tree decoder give the drafts, emissions and passes of
    `EagleDrafter` through the chain decoder: the tree's positions, mask and stable
    cache are the chain's (after the first round, where the tree drafts from a uniform q
    and the chain drafts nothing)."""
    model = make_model("llama", seed=26)
    head = eagle(model, 4)
    prompt = torch.tensor([[4, 8, 15, 16, 23, 42]])
    source = FeatureTreeForward(model)
    tree_out = tree_speculative_generate(source, EagleTreeSource(head, source), prompt,
                                         max_new_tokens=40, widths=(1, 1, 1), sampling=GREEDY)
    chain_source = FeatureSource(model)
    chain_out = speculative_generate(chain_source, EagleDrafter(head, chain_source), prompt,
                                     max_new_tokens=40, num_draft_tokens=3, sampling=GREEDY)
    assert torch.equal(tree_out.sequences, chain_out.sequences)
    tree_rounds = [(r.drafted, r.emitted) for r in tree_out.trace[1:]]
    chain_rounds = [(r.drafted, r.emitted) for r in chain_out.trace[1:]]
    assert tree_rounds == chain_rounds
    assert tree_out.stats.accepted_tokens - tree_out.trace[0].num_accepted == chain_out.stats.accepted_tokens


@pytest.mark.parametrize("kind", ["medusa", "eagle"])
def test_features_follow_the_accepted_path(kind):
    """After a round the target's feature rows are those of the output's positions, as a
    fresh cache-free pass gives them (the rejected branches' rows are dropped)."""
    model = make_model("llama", seed=22)
    source = FeatureTreeForward(model)
    draft = tree_draft(kind, model, source)
    prompt = torch.tensor([[3, 14, 15, 9, 2, 6]])
    out = tree_speculative_generate(source, draft, prompt, max_new_tokens=12, widths=(3, 2),
                                    sampling=SamplingConfig(temperature=1.0),
                                    generator=torch.Generator().manual_seed(0))
    seen = {}
    hook = source.parts.norm.register_forward_hook(lambda m, i, o: seen.__setitem__("h", i[0]))
    try:
        model(out.sequences, use_cache=False)
    finally:
        hook.remove()
    held = source.features.size(0)
    assert held == out.sequences.size(1) - 1  # the last token emitted is unseen
    assert torch.allclose(source.features, seen["h"][0, :held], atol=1e-4, rtol=1e-4)


def _head_tree_generate(model, heads, widths, sampling, num_tokens, children="sampled"):
    source = FeatureTreeForward(model)
    draft = (MedusaTreeSource if isinstance(heads, MedusaHeads) else EagleTreeSource)(heads, source)

    def generate(input_ids, generator):
        return tree_speculative_generate(source, draft, input_ids, max_new_tokens=num_tokens,
                                         widths=widths, sampling=sampling, generator=generator,
                                         children=children).sequences

    return generate


@pytest.mark.parametrize("kind,widths,children", [("medusa", (3, 2), "sampled"), ("eagle", (3, 2), "sampled"),
                                                   ("eagle", (3, 2), "top-k")])
def test_head_tree_sampling_follows_the_target_law(kind, widths, children):
    """Four sampled tokens (two rounds or more, the second drafted by the heads) pass the
    audit against the target's exact law; the same samples fail against the law at
    another temperature, so the audit can fail."""
    model = make_model("llama", vocab=6, width=32, seed=23, init_range=0.5)
    heads = medusa(model, num_heads=2, scale=1.0, seed=3) if kind == "medusa" else eagle(model, 3)
    sampling = SamplingConfig(temperature=1.0)
    prompt = torch.tensor([[2, 4, 1]])
    law = target_law(model, prompt, sampling, 4)
    generate = _head_tree_generate(model, heads, widths, sampling, 4, children)
    result = audit(generate, prompt, law, num_samples=1500, num_tokens=4,
                   generator=torch.Generator().manual_seed(1))
    assert result.passed, result.summary()
    wrong = target_law(model, prompt, SamplingConfig(temperature=0.6), 4)
    result = audit(generate, prompt, wrong, num_samples=1500, num_tokens=4,
                   generator=torch.Generator().manual_seed(1))
    assert not result.passed, result.summary()


def test_bad_arguments_are_named():
    model = make_model("llama", seed=24)
    source = FeatureTreeForward(model)
    with pytest.raises(TypeError, match="FeatureTreeForward"):
        MedusaTreeSource(medusa(model), model)
    draft = MedusaTreeSource(medusa(model, num_heads=2), source)
    with pytest.raises(ValueError, match="needs 3 Medusa heads, these have 2"):
        tree_speculative_generate(source, draft, torch.tensor([[1, 2, 3]]), max_new_tokens=8,
                                  widths=(2, 1, 1), sampling=GREEDY)
    other = FeatureTreeForward(make_model("llama", seed=25))
    with pytest.raises(ValueError, match="pass this source's FeatureTreeForward"):
        tree_speculative_generate(other, draft, torch.tensor([[1, 2, 3]]), max_new_tokens=8,
                                  widths=(2, 1), sampling=GREEDY)


def test_committed_tree_report_is_exact_and_ranks_the_heads():
    """specdec_ref/data/head-trees-tiny-cpu.json (python -m specdec_ref.bench.head_trees): every
    greedy arm is the target's own output on every prompt, and EAGLE's head gives more tokens
    per target pass than the separate draft in the same chain and trees (the method's claim)."""
    from specdec_ref.reports import read_report

    results = read_report("head-trees-tiny-cpu.json")["results"]
    prompts = read_report("head-trees-tiny-cpu.json")["meta"]["prompts"]
    for shapes in results.values():
        for modes in shapes.values():
            assert modes["greedy"]["matches_target_greedy"] == f"{prompts}/{prompts}"
    for shape in results["EAGLE head"]:
        for mode in ("greedy", "T=0.7, sampled children"):
            eagle = results["EAGLE head"][shape][mode]["tokens_per_target_call"]
            assert eagle > results["separate draft"][shape][mode]["tokens_per_target_call"], (shape, mode)
