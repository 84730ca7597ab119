"""Draft heads (Medusa, EAGLE) drafting for the unchanged decoder: exact, greedy-equal, rolled back."""

from __future__ import annotations

import pytest
import torch
from conftest import make_model

from specdec_ref import SamplingConfig, speculative_generate
from specdec_ref.heads.drafters import EagleDrafter, MedusaDrafter
from specdec_ref.heads.eagle import EagleHead
from specdec_ref.heads.features import FeatureSource, TargetParts, final_norm
from specdec_ref.heads.law import head_law
from specdec_ref.heads.medusa import MedusaHeads
from specdec_ref.kv_cache import CachedForward
from specdec_ref.laws import law_tv, target_law

GREEDY = SamplingConfig(temperature=0.0)


def random_heads(target, kind: str, seed: int = 0, scale: float = 0.0):
    """A random EAGLE head, or Medusa heads whose blocks are moved off the identity by `scale`."""
    torch.manual_seed(seed)
    if kind == "eagle":
        return EagleHead.for_target(target).eval()
    heads = MedusaHeads.for_target(target, 3)
    with torch.no_grad():
        for block in heads.blocks:
            block.linear.weight.normal_(0, scale)
    return heads.eval()


def drafter_for(kind: str, heads, source, **kwargs):
    return (EagleDrafter if kind == "eagle" else MedusaDrafter)(heads, source, **kwargs)


def full_features(model, ids: torch.Tensor) -> torch.Tensor:
    """The input of the final norm at every position of one cache-free pass: (n, H)."""
    seen = {}
    hook = final_norm(model).register_forward_hook(lambda m, i, o: seen.__setitem__("h", i[0]))
    try:
        model(ids, use_cache=False)
    finally:
        hook.remove()
    return seen["h"][0]


def test_features_come_from_the_verification_pass():
    """One pass gives the model's own logits and the features that made them: lm_head(norm(h))."""
    model = make_model("llama", seed=3)
    ids = torch.randint(0, 48, (1, 12), generator=torch.Generator().manual_seed(0))
    source, plain = FeatureSource(model), CachedForward(model)
    logits = source.last_logits(ids[:, :7], 7)  # (7, V)
    assert torch.equal(logits, plain.last_logits(ids[:, :7], 7))
    logits = source.last_logits(ids, 5)  # the next 5 positions, read from the cache
    assert source.forward_calls == 2 and source.features.shape == (12, 64)
    features = full_features(model, ids)  # (12, H)
    assert torch.allclose(source.features, features, atol=1e-5)
    assert torch.allclose(TargetParts.of(model).logits(source.features[-5:]), logits, atol=1e-5)


def test_rollback_drops_features_with_the_cache():
    """After rollback(n) the features are the first n rows, and a new pass appends a fresh pass's rows."""
    model = make_model("llama", seed=4)
    ids = torch.randint(0, 48, (1, 14), generator=torch.Generator().manual_seed(1))
    source = FeatureSource(model)
    source.last_logits(ids[:, :10], 1)
    source.rollback(6)
    assert source.features.shape[0] == source.cached_length == 6
    source.last_logits(ids, 8)
    assert torch.allclose(source.features, full_features(model, ids), atol=1e-5)
    source.rollback(0)
    assert source.features.shape[0] == 0


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_greedy_matches_target_generate(kind):
    """Greedy decoding with a random head is the target's own greedy `generate`, token for token."""
    model = make_model("llama", layers=2, seed=5, init_range=0.3)
    prompt = torch.tensor([[3, 17, 9, 30, 4]])
    expected = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=40,
                              **GREEDY.generate_kwargs())
    source = FeatureSource(model)
    drafter = drafter_for(kind, random_heads(model, kind, scale=0.5), source)
    for k in (1, 3):
        out = speculative_generate(source, drafter, prompt, max_new_tokens=40, num_draft_tokens=k,
                                   sampling=GREEDY)
        assert torch.equal(out.sequences, expected), (kind, k)
        assert out.stats.drafted_tokens > 0 and out.stats.target_calls == out.stats.iterations


def eagle_from_scratch(head, model, sequence: torch.Tensor, drafts: list[int]) -> torch.Tensor:
    """The head's logits for each draft slot with no cache: every pass re-reads every real
    position (one causal pass) and the drafts so far on its own features: (K, V)."""
    parts = TargetParts.of(model)
    n = sequence.size(1)
    features = full_features(model, sequence[:, :-1])  # h_0..h_{n-2}, (n - 1, H)
    tokens = sequence[0, 1:].tolist()  # x_1..x_{n-1}
    own, rows = [], []
    for i in range(len(drafts)):
        inputs = torch.cat([features, *own])[None]  # (1, n - 1 + i, H)
        ids = torch.tensor([tokens + drafts[:i]])  # (1, n - 1 + i)
        predicted = head(parts.embed(ids), inputs, torch.arange(n - 1 + i)[None])[:, -1]  # (1, H)
        own.append(predicted)
        rows.append(parts.logits(predicted)[0])
    return torch.stack(rows)  # (K, V)


def test_eagle_stable_cache_matches_full_recompute():
    """After rounds of drafting and rollback, the cached head drafts what a recompute from scratch does."""
    model = make_model("llama", layers=2, seed=7, init_range=0.3)
    head = random_heads(model, "eagle", seed=1)
    source = FeatureSource(model)
    sampling = SamplingConfig(temperature=1.0)
    generator = torch.Generator().manual_seed(0)
    drafter = EagleDrafter(head, source)
    out = speculative_generate(source, drafter, torch.tensor([[2, 8, 13, 21, 34]]), max_new_tokens=17,
                               num_draft_tokens=3, sampling=sampling, generator=generator)
    assert out.stats.iterations > 4  # rounds were rolled back
    # The decoder's bound copy shares the cache: it holds the real entries of earlier rounds,
    # which this draft reuses (it feeds only the positions verified since).
    assert 5 <= drafter.cache.real < out.sequences.size(1) - 1
    bound = drafter.bind(sampling, generator)
    draft = bound.draft(out.sequences, 3, 48)
    expected = eagle_from_scratch(head, model, out.sequences, draft.tokens.tolist()).softmax(-1)
    assert torch.allclose(draft.probs, expected, atol=1e-5)


def toy_target():
    """A Llama target on 5 tokens with spread logits: its law is enumerable."""
    return make_model("llama", layers=1, width=16, vocab=5, seed=8, init_range=0.6)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=3)])
def test_head_law_is_the_target_law(kind, sampling):
    """By enumeration: the first 3 tokens with a random head follow the target's law to 1e-12;
    resampling from p after a rejection (the article's rule) does not."""
    model = toy_target()
    prompt = torch.tensor([[1, 3]])
    source = FeatureSource(model)
    drafter = drafter_for(kind, random_heads(model, kind, scale=2.0), source)
    expected = target_law(model, prompt, sampling, 3)
    law = head_law(drafter, prompt, num_draft_tokens=2, sampling=sampling, num_tokens=3)
    assert abs(sum(law.values()) - 1) < 1e-12
    assert max(abs(law.get(o, 0.0) - expected.get(o, 0.0)) for o in set(law) | set(expected)) < 1e-12
    biased = head_law(drafter, prompt, num_draft_tokens=2, sampling=sampling, num_tokens=3, rule="article")
    assert law_tv(biased, expected) > 1e-3


def test_sampled_output_uses_the_decoders_generator():
    """Sampling with a head is reproducible from the decoder's generator alone."""
    model = make_model("llama", layers=2, seed=9)
    source = FeatureSource(model)
    drafter = EagleDrafter(random_heads(model, "eagle"), source)
    runs = [speculative_generate(source, drafter, torch.tensor([[4, 5]]), max_new_tokens=12,
                                 sampling=SamplingConfig(temperature=1.0),
                                 generator=torch.Generator().manual_seed(3)).sequences for _ in range(2)]
    assert torch.equal(*runs)


def test_bad_input_gives_named_errors(tmp_path):
    """A head's drafter refuses another sampling, another target, a wrong source, a bad K, a bad folder."""
    model = make_model("llama", layers=1, seed=10)
    source = FeatureSource(model)
    head = random_heads(model, "eagle")
    prompt = torch.tensor([[4, 5, 6]])
    drafter = EagleDrafter(head, source, sampling=SamplingConfig(temperature=0.5))
    with pytest.raises(ValueError, match="differs from the decoder's"):
        speculative_generate(source, drafter, prompt, max_new_tokens=4, sampling=GREEDY)
    with pytest.raises(ValueError, match="pass the drafter's FeatureSource to the decoder as target_model"):
        speculative_generate(model, EagleDrafter(head, source), prompt, max_new_tokens=8, sampling=GREEDY)
    with pytest.raises(TypeError, match="source must be a heads.FeatureSource"):
        EagleDrafter(head, CachedForward(model))
    with pytest.raises(ValueError, match="num_draft_tokens must be an integer >= 1"):
        EagleDrafter(head, source, num_draft_tokens=0)
    with pytest.raises(ValueError, match="num_heads must be an integer >= 1"):
        MedusaHeads(64, 0, 48)
    with pytest.raises(ValueError, match="not a saved head"):
        EagleHead.load(tmp_path, model)
    head.save(tmp_path / "eagle")
    other = make_model("llama", layers=1, vocab=40, seed=11)
    with pytest.raises(ValueError, match="does not fit the target"):
        EagleHead.load(tmp_path / "eagle", other)
    with pytest.raises(ValueError, match="has no final norm"):
        final_norm(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="vocab_size=47, but the source's LM head has 48 rows"):
        EagleDrafter(head, source).bind(GREEDY, None).draft(prompt, 2, 47)
    with pytest.raises(ValueError, match="has no sampling configuration"):
        EagleDrafter(head, source).draft(prompt, 2, 48)
    with pytest.raises(ValueError, match="rule must be 'exact' or 'article'"):
        head_law(drafter, prompt, num_draft_tokens=2, sampling=SamplingConfig(), num_tokens=1, rule="typical")
    with pytest.raises(ValueError, match="temperature > 0"):
        head_law(drafter, prompt, num_draft_tokens=2, sampling=GREEDY, num_tokens=1)


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_saved_head_round_trips(tmp_path, kind):
    """A saved head loads back (float16 on disk) and drafts what it drafted before, to rounding."""
    model = make_model("llama", layers=1, seed=12)
    heads = random_heads(model, kind, scale=0.5)
    heads.save(tmp_path)
    loaded = type(heads).load(tmp_path, model)
    for a, b in zip(heads.state_dict().values(), loaded.state_dict().values(), strict=True):
        assert torch.allclose(a, b, atol=2e-3, rtol=1e-3)


SHIPPED = {"eagle": ("eagle-head", EagleHead, EagleDrafter), "medusa": ("medusa-heads", MedusaHeads, MedusaDrafter)}


@pytest.mark.parametrize("kind", ["eagle", "medusa"])
def test_shipped_head_matches_target_greedy(kind):
    """The trained head shipped in pairs/tiny drafts for the tiny target: greedy output is the target's
    own, token for token, and it drafts far better than chance (a loading error would not)."""
    from specdec_ref.models import TINY_DIR, load_pair

    folder, head_class, drafter_class = SHIPPED[kind]
    if not (TINY_DIR / folder / "config.json").is_file():
        pytest.skip(f"no trained {kind} head is shipped in pairs/tiny/{folder}")
    _, target, tokenizer = load_pair("tiny", device="cpu")
    source = FeatureSource(target)
    drafter = drafter_class(head_class.load(TINY_DIR / folder, target), source)
    prompt = tokenizer("import os\n\n\ndef read_config(path):\n", return_tensors="pt").input_ids
    expected = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=48,
                               **GREEDY.generate_kwargs())
    out = speculative_generate(source, drafter, prompt, max_new_tokens=48, num_draft_tokens=4, sampling=GREEDY)
    assert torch.equal(out.sequences, expected[:, : out.sequences.size(1)])
    assert out.sequences.size(1) == expected.size(1) or int(out.sequences[0, -1]) == tokenizer.eos_token_id
    # Held out, the card measures alpha 0.81 (EAGLE) and 0.28 (Medusa); untrained heads accept
    # next to nothing.
    assert out.stats.per_token_acceptance > {"eagle": 0.5, "medusa": 0.1}[kind], out.stats


def test_small_random_pair_builds_the_llama_family_the_eagle_head_needs():
    """chapter 10's toy target: `small_random_pair(family="llama")` takes an EAGLE head; a
    GPT-2 target is refused by name, and so is an unknown family."""
    from specdec_ref.laws import small_random_pair

    llama, draft = small_random_pair(5, seed=1, family="llama")
    assert type(llama).__name__ == "LlamaForCausalLM" and llama.config.num_hidden_layers == 2
    assert draft.config.num_hidden_layers == 1
    EagleHead.for_target(llama)  # builds
    gpt2, _ = small_random_pair(5, seed=1)
    with pytest.raises(ValueError, match="Llama-family"):
        EagleHead.for_target(gpt2)
    with pytest.raises(ValueError, match="family must be"):
        small_random_pair(5, family="bert")
