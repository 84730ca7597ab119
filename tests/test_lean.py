"""The lean draft forward computes the same logits as transformers' cached forward, faster per call."""

import inspect

import pytest
import torch
from conftest import make_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from specdec_ref import SamplingConfig, autoregressive_generate, speculative_generate
from specdec_ref.drafting import ModelDrafter
from specdec_ref.fast.lean import LeanForward
from specdec_ref.fast.packed import PackedLinear, pack_linear_layers, packing_unsupported
from specdec_ref.kv_cache import CachedForward

GREEDY = SamplingConfig(temperature=0.0)


def qwen2_model(seed: int = 0) -> Qwen2ForCausalLM:
    """A small random Qwen2: q/k/v biases and grouped-query attention."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=50, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         initializer_range=0.2, use_sliding_window=False)
    return Qwen2ForCausalLM(config).eval()


@pytest.mark.parametrize("build", [lambda: make_model("llama", layers=2, seed=3), qwen2_model],
                         ids=["llama", "qwen2"])
def test_logits_match_cached_forward_across_passes_and_rollbacks(build, device):
    """Passes of 1 and several tokens, rollbacks to shorter lengths: logits agree to 1e-5 (float32)."""
    model = build().to(device)
    lean, cached = LeanForward(model), CachedForward(model)
    sequence = torch.randint(2, 48, (1, 40), generator=torch.Generator().manual_seed(0)).to(device)
    # (length fed up to, positions asked for, rollback to afterwards)
    steps = [(12, 3, 12), (13, 1, 13), (18, 5, 14), (19, 5, 19), (20, 1, 16), (25, 9, 25)]
    for end, m, keep in steps:
        ours, theirs = lean.last_logits(sequence[:, :end], m), cached.last_logits(sequence[:, :end], m)
        assert ours.shape == theirs.shape == (m, model.config.vocab_size)
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)
        lean.rollback(keep)
        cached.rollback(keep)
    assert lean.forward_calls == cached.forward_calls == len(steps)


@pytest.mark.skipif(packing_unsupported(torch.nn.Linear(2, 2)) is not None,
                    reason="this torch build cannot prepack linear layers")
def test_a_prepacked_draft_runs_its_packed_kernels(monkeypatch):
    """On a model whose layers `pack_linear_layers` swapped, the lean pass calls those layers
    (their prepacked kernels), and its logits still agree with the cached forward's."""
    model = make_model("llama", layers=2, seed=3)
    pack_linear_layers(model)
    calls = []
    forward = PackedLinear.forward
    monkeypatch.setattr(PackedLinear, "forward", lambda self, x: calls.append(self) or forward(self, x))
    lean, cached = LeanForward(model), CachedForward(model)  # built after the patch: they call it
    sequence = torch.randint(2, 48, (1, 20), generator=torch.Generator().manual_seed(0))
    ours = lean.last_logits(sequence, 4)
    layers = sum(isinstance(module, PackedLinear) for module in model.modules())
    assert len(calls) == layers  # 7 per block and the head, once each
    assert torch.allclose(ours, cached.last_logits(sequence, 4), atol=1e-5, rtol=0)


def test_a_lean_draft_keeps_the_target_greedy_output(device):
    """The lean draft changes the speed only: greedy output is the target's, token for token."""
    target, draft = make_model("llama", layers=3, seed=1).to(device), make_model("llama", layers=1, seed=2).to(device)
    prompt = torch.tensor([[3, 9, 4, 1, 5]], device=device)
    alone = autoregressive_generate(target, prompt, max_new_tokens=30, sampling=GREEDY)
    for k in (1, 4):
        drafter = ModelDrafter(LeanForward(draft), GREEDY)
        out = speculative_generate(target, drafter, prompt, max_new_tokens=30, num_draft_tokens=k,
                                   sampling=GREEDY)
        assert torch.equal(out.sequences, alone.sequences)
        plain = speculative_generate(target, draft, prompt, max_new_tokens=30, num_draft_tokens=k,
                                     sampling=GREEDY)
        assert [r.drafted for r in out.trace] == [r.drafted for r in plain.trace]  # same drafts


def test_unsupported_models_and_bad_lengths_are_refused():
    """Errors name the model type or the argument."""
    with pytest.raises(ValueError, match="model type 'gpt2'"):
        LeanForward(make_model("gpt2", layers=1))
    model = make_model("llama", layers=1)
    with pytest.raises(ValueError, match="max_length"):
        LeanForward(model, max_length=0)
    lean = LeanForward(model, max_length=8)
    with pytest.raises(ValueError, match="max_length=8"):
        lean.last_logits(torch.ones(1, 9, dtype=torch.long), 1)
    lean.last_logits(torch.ones(1, 4, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="rollback"):
        lean.last_logits(torch.ones(1, 4, dtype=torch.long), 1)


@pytest.mark.parametrize("rope", [
    {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0},
    {"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": [1.0] * 8, "long_factor": [4.0] * 8,
     "factor": 4.0},
], ids=["dynamic", "longrope"])
def test_rope_tables_that_follow_the_sequence_length_are_refused(rope):
    """"dynamic" and "longrope" change every position's cos / sin as the sequence grows past
    max_position_embeddings: one table computed up front is wrong, so LeanForward refuses
    them, by the rule of fast.static_unsupported."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec_ref.fast import static_unsupported
    from specdec_ref.fast.lean import lean_unsupported

    torch.manual_seed(0)
    # transformers 5 names the rope settings rope_parameters; 4.x took rope_scaling and rope_theta.
    if "rope_parameters" in inspect.signature(LlamaConfig.__init__).parameters:
        rope_kwargs = {"rope_parameters": rope}
    else:
        rope_kwargs = {"rope_scaling": {k: v for k, v in rope.items() if k != "rope_theta"},
                       "rope_theta": rope["rope_theta"]}
    config = LlamaConfig(vocab_size=48, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
                         **rope_kwargs)
    model = LlamaForCausalLM(config).eval()
    assert lean_unsupported(model) == static_unsupported(model) == \
        f"rope type {rope['rope_type']!r} depends on the sequence length"
    with pytest.raises(ValueError, match=f"LeanForward cannot run LlamaForCausalLM: rope type '{rope['rope_type']}'"):
        LeanForward(model, max_length=60)
