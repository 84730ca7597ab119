"""fast.prepare: one call to the fastest exact path, and the sampling configuration given once.

The exactness of the prepared path (greedy equal to the prepared target's `generate`, the
law of sampled tokens, the budget's end) is tested with the teaching path's own tests,
through the "prepared" value of the `path` fixture (conftest.PATHS).
"""

import pytest
import torch
from conftest import make_model, needs_bf16_packing, noisy_copy

from specdec_ref import SamplingConfig, speculative_generate
from specdec_ref.drafting import ModelDrafter
from specdec_ref.fast import FastPair, LeanForward, StaticForward, prepare
from specdec_ref.fast import prepared as prepared_module
from specdec_ref.fast.batch_invariant import GROUPED
from specdec_ref.fast.packed import is_packed

GREEDY = SamplingConfig(temperature=0.0)


def llama_pair():
    target = make_model("llama", layers=2, seed=1)
    return noisy_copy(target, noise=0.3, seed=3), target


@pytest.mark.parametrize("native", [pytest.param(True, marks=needs_bf16_packing), False])
def test_cpu_choices_follow_the_cpu_and_describe_says_them(native, monkeypatch):
    """bfloat16 only where the CPU computes it; packed, grouped attention and a lean draft
    always; describe() names each choice on a line of at most 80 characters."""
    monkeypatch.setattr(prepared_module, "cpu_computes_bfloat16", lambda: native)
    draft, target = llama_pair()
    fast = prepare(draft, target)
    assert isinstance(fast, FastPair) and fast.target is target and fast.target_model is target
    assert isinstance(fast.draft, LeanForward) and fast.draft.model is draft
    expected = torch.bfloat16 if native else torch.float32
    assert target.dtype == draft.dtype == expected
    assert is_packed(target) and is_packed(draft)
    assert target.config._attn_implementation == GROUPED
    text = fast.describe()
    assert all(len(line) <= 80 for line in text.splitlines())
    for word in ("dtype", "linear", "attention", "draft", "target", str(expected).removeprefix("torch.")):
        assert word in text


def test_a_draft_lean_cannot_run_stays_a_model_and_says_why():
    target = make_model("gpt2", layers=2, seed=1)
    draft = noisy_copy(target, noise=0.3, seed=3)
    fast = prepare(draft, target, dtype=torch.float32)
    assert fast.draft is draft and "gpt2" in fast.choices["draft"]
    assert target.dtype == torch.float32 and "as asked" in fast.choices["dtype"]


def test_prepare_refuses_bad_arguments():
    draft, target = llama_pair()
    with pytest.raises(ValueError, match="dtype must be a floating-point torch.dtype"):
        prepare(draft, target, dtype=torch.int64)
    with pytest.raises(ValueError, match="dtype must be"):
        prepare(draft, target, dtype="bfloat16")
    if torch.cuda.is_available():
        with pytest.raises(ValueError, match="put both on one device"):
            prepare(draft.cuda(), target)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the GPU path needs CUDA")
def test_gpu_choice_is_the_static_cache_with_graphs():
    draft, target = (model.cuda() for model in llama_pair())
    fast = prepare(draft, target, max_length=64)
    assert isinstance(fast.target, StaticForward) and isinstance(fast.draft, StaticForward)
    assert fast.target.max_length == 64 and "CUDA graphs" in fast.describe()
    prompt = torch.tensor([[3, 4, 5]], device="cuda")
    expected = target.generate(prompt, max_new_tokens=20, min_new_tokens=20, do_sample=False)
    out = speculative_generate(fast.target, fast.draft, prompt, max_new_tokens=20, sampling=GREEDY)
    assert torch.equal(out.sequences, expected)


def test_a_drafter_without_sampling_takes_the_decoders_and_equals_the_model_path():
    """The sampling configuration is passed once: a ModelDrafter built without one (or a
    bare logits source) drafts with speculative_generate's, and gives the same tokens as
    the draft model passed directly, for the same seed."""
    draft, target = llama_pair()
    prompt = torch.tensor([[5, 6, 7]])
    sampling = SamplingConfig(temperature=0.8, top_k=20)

    def run(draft_argument):
        return speculative_generate(target, draft_argument, prompt, max_new_tokens=24, num_draft_tokens=3,
                                    sampling=sampling, generator=torch.Generator().manual_seed(5)).sequences

    reference = run(draft)
    assert torch.equal(run(ModelDrafter(draft)), reference)
    assert torch.equal(run(ModelDrafter(draft, sampling)), reference)
    lean = run(LeanForward(draft))  # a logits source as draft_model: float rounding may differ
    assert lean.shape == reference.shape


def test_a_drafter_built_with_other_sampling_is_refused():
    draft, target = llama_pair()
    drafter = ModelDrafter(draft, SamplingConfig(temperature=0.5))
    with pytest.raises(ValueError, match="differs from the decoder's"):
        speculative_generate(target, drafter, torch.tensor([[5, 6]]), max_new_tokens=4,
                             sampling=SamplingConfig(temperature=1.0))
    with pytest.raises(ValueError, match="no sampling configuration"):
        ModelDrafter(draft).draft(torch.tensor([[5, 6]]), 2, 64)


def test_a_wrong_draft_argument_names_what_is_allowed():
    _, target = llama_pair()
    with pytest.raises(TypeError, match="draft_model must be a transformers PreTrainedModel, a logits source"):
        speculative_generate(target, "gpt2", torch.tensor([[5, 6]]), max_new_tokens=4)


def test_the_rotary_frequencies_stay_float32_as_from_pretrained_keeps_them(tmp_path):
    """A pair prepared in bfloat16 decodes as the same pair loaded in bfloat16: a plain
    `.to(bfloat16)` would round the rotary frequencies and move greedy near-ties."""
    from transformers import LlamaForCausalLM

    draft, target = llama_pair()
    target.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    before = target.model.rotary_emb.inv_freq.clone()
    prepare(draft, target, dtype=torch.bfloat16)
    assert target.model.rotary_emb.inv_freq.dtype == torch.float32
    assert torch.equal(target.model.rotary_emb.inv_freq, before)
    assert torch.equal(target.model.rotary_emb.inv_freq, loaded.model.rotary_emb.inv_freq)
    assert all(p.dtype == torch.bfloat16 for p in target.parameters())


def test_a_sliding_window_target_keeps_its_attention_and_dtype(monkeypatch):
    """GROUPED attention falls back to sdpa under a sliding window (and cannot soft-cap), so
    rows are no longer bitwise a step's: prepare then keeps the attention and the dtype
    (its greedy exactness is tested in test_edges' sliding-window test)."""
    from transformers import MistralConfig, MistralForCausalLM

    monkeypatch.setattr(prepared_module, "cpu_computes_bfloat16", lambda: True)
    config = MistralConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=6)
    target, draft = MistralForCausalLM(config).eval(), MistralForCausalLM(config).eval()
    fast = prepare(draft, target)
    assert target.dtype == torch.float32 and target.config._attn_implementation != GROUPED
    assert "sliding window" in fast.choices["attention"] and "needs grouped" in fast.choices["dtype"]
    assert all(len(line) <= 80 for line in fast.describe().splitlines())


@pytest.mark.parametrize("dtype", [torch.float16, torch.float64])
def test_a_dtype_onednn_cannot_pack_is_prepared_unpacked(dtype):
    """float16 or float64 asked for on a CPU: the plan judges packing in that dtype (not the one
    loaded), so prepare leaves the layers plain, both models in that dtype, and greedy exact."""
    draft, target = llama_pair()
    chosen = prepared_module.plan(draft, target, dtype=dtype)
    assert not chosen.pack and str(dtype).removeprefix("torch.") in chosen.choices["linear"]
    fast = prepare(draft, target, dtype=dtype)
    assert target.dtype == draft.dtype == dtype and not is_packed(target) and not is_packed(draft)
    prompt = torch.tensor([[3, 4, 5]])
    expected = fast.target_model.generate(prompt, max_new_tokens=16, min_new_tokens=16, do_sample=False)
    out = speculative_generate(fast.target, fast.draft, prompt, max_new_tokens=16, sampling=GREEDY)
    assert torch.equal(out.sequences, expected)
    assert all(len(line) <= 80 for line in fast.describe().splitlines())


def snapshot(model) -> tuple:
    """What prepare may change: parameters (dtype and values), layer classes, attention."""
    return ([(name, p.dtype, p.detach().clone()) for name, p in model.named_parameters()],
            [type(m).__name__ for m in model.modules()], model.config._attn_implementation)


def same(before: tuple, after: tuple) -> bool:
    params = all(n1 == n2 and d1 == d2 and torch.equal(p1, p2)
                 for (n1, d1, p1), (n2, d2, p2) in zip(before[0], after[0], strict=True))
    return params and before[1:] == after[1:]


@pytest.mark.parametrize("kwargs", [{"max_length": "x"}, {"max_length": -5}, {"max_length": 2.5},
                                    {"dtype": torch.int64}])
def test_a_refused_prepare_leaves_both_models_as_they_were(kwargs):
    """Every argument is checked before the first model is touched: a ValueError naming it,
    and the same parameters, dtypes, layers and attention as before."""
    draft, target = llama_pair()
    before = snapshot(draft), snapshot(target)
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        prepare(draft, target, **kwargs)
    assert same(before[0], snapshot(draft)) and same(before[1], snapshot(target))
