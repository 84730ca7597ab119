"""The static-cache fast path computes the same logits as transformers' cached forward.

`fast.StaticForward` owns a preallocated cache whose rollback only moves a length, and
on CUDA replays captured graphs. Its exactness in the decoder (greedy equal to
`generate`, the chi-square law test, the budget end, its rollback in every way an
iteration can end) is tested through the `path` fixture in test_decoder.py and
test_kv_cache.py; here: its logits across passes and rollbacks, and its refusals.
"""

import pytest
import torch
from conftest import make_model
from test_lean import qwen2_model

from specdec_ref import SamplingConfig
from specdec_ref.drafting import ModelDrafter
from specdec_ref.fast import StaticForward, static_unsupported
from specdec_ref.fast.packed import pack_linear_layers, packing_unsupported
from specdec_ref.kv_cache import CachedForward, FullForward

GREEDY = SamplingConfig(temperature=0.0)
BUILDS = {
    "gpt2": lambda: make_model("gpt2", layers=2, seed=3),
    "llama": lambda: make_model("llama", layers=2, seed=3),
    "qwen2": qwen2_model,
}
# (length fed up to, positions asked for, rollback to afterwards): a prompt, one-token
# steps, K + 1-token passes, rollbacks after none, some and all of a block accepted.
STEPS = [(12, 3, 12), (13, 1, 13), (18, 5, 14), (19, 5, 19), (20, 1, 16), (25, 9, 25), (26, 1, 22), (27, 5, 27)]


@pytest.mark.parametrize("family", list(BUILDS))
@pytest.mark.parametrize("static_shapes", [False, True], ids=["cached-length", "whole-buffer"])
def test_logits_match_cached_forward_across_passes_and_rollbacks(family, static_shapes, device):
    """Passes of 1 and several tokens, rollbacks to shorter lengths: logits agree to 1e-5 (float32),
    whether attention reads the cached length or the whole buffer through the mask (as a graph does)."""
    model = BUILDS[family]().to(device)
    static, cached = StaticForward(model, max_length=40, static_shapes=static_shapes), CachedForward(model)
    sequence = torch.randint(2, 48, (1, 40), generator=torch.Generator().manual_seed(0)).to(device)
    for end, m, keep in STEPS:
        ours, theirs = static.last_logits(sequence[:, :end], m), cached.last_logits(sequence[:, :end], m)
        assert ours.shape == theirs.shape == (m, model.config.vocab_size)
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), (ours - theirs).abs().max()
        static.rollback(keep)
        cached.rollback(keep)
    assert static.forward_calls == cached.forward_calls == len(STEPS)
    # A graph is captured per pass size only on CUDA.
    assert bool(static.graphs) == (device == "cuda" and static_shapes)


def test_stale_columns_past_the_length_are_never_read():
    """After a rollback the rejected tokens' keys stay in the buffer: filling those columns
    with garbage changes nothing, because the mask stops every query at its own position."""
    model = make_model("llama", layers=2, seed=3)
    static = StaticForward(model, max_length=32, static_shapes=True)
    sequence = torch.randint(2, 48, (1, 20), generator=torch.Generator().manual_seed(1))
    static.last_logits(sequence[:, :16], 1)
    static.rollback(10)
    for keys, values in zip(static.keys, static.values, strict=True):
        keys[:, 10:].normal_()
        values[:, 10:].normal_()
    ours = static.last_logits(sequence, 10)
    assert torch.allclose(ours, FullForward(model).last_logits(sequence, 10), atol=1e-5, rtol=0)


@pytest.mark.skipif(packing_unsupported(torch.nn.Linear(2, 2)) is not None,
                    reason="this torch build cannot prepack linear layers")
def test_a_prepacked_model_runs_through_the_static_cache():
    """The blocks call the model's own layers, so prepacked ones work unchanged."""
    model = make_model("llama", layers=2, seed=3)
    sequence = torch.randint(2, 48, (1, 20), generator=torch.Generator().manual_seed(0))
    expected = CachedForward(model).last_logits(sequence, 4)
    pack_linear_layers(model)
    assert torch.allclose(StaticForward(model, max_length=20).last_logits(sequence, 4), expected, atol=1e-4)


def test_unsupported_models_and_misuse_are_refused():
    """Each refusal names what is wrong: the model, the lengths, the device, moved weights."""
    from transformers import MistralConfig, MistralForCausalLM

    sliding = MistralForCausalLM(MistralConfig(vocab_size=40, hidden_size=32, intermediate_size=64,
                                               num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                               sliding_window=8)).eval()
    assert "model type 'mistral'" in static_unsupported(sliding)
    with pytest.raises(ValueError, match="cannot run MistralForCausalLM"):
        StaticForward(sliding)
    model = make_model("gpt2", layers=1, seed=0, positions=64)
    assert "training mode" in static_unsupported(model.train())
    model.eval()
    with pytest.raises(ValueError, match=r"max_length must be an integer in \[1, 64\]"):
        StaticForward(model, max_length=65)
    with pytest.raises(ValueError, match="max_graph_tokens must be an integer >= 1"):
        StaticForward(model, max_graph_tokens=0)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="cuda_graphs=True needs the model on a CUDA device"):
            StaticForward(model, cuda_graphs=True)
    static = StaticForward(model, max_length=8)
    assert static.max_length == 8 and not static.cuda_graphs
    with pytest.raises(ValueError, match="more than max_length=8"):
        static.last_logits(torch.zeros(1, 9, dtype=torch.long), 1)
    with pytest.raises(ValueError, match="num_positions=3 but 2 tokens are unseen"):
        static.last_logits(torch.zeros(1, 2, dtype=torch.long), 3)
    model.to(torch.float64)
    with pytest.raises(RuntimeError, match="weights moved or changed dtype"):
        static.last_logits(torch.zeros(1, 2, dtype=torch.long), 1)


def test_the_decoder_refuses_a_static_cache_too_small_for_the_budget():
    """prompt + max_new_tokens beyond max_length: a ValueError before any pass, naming max_length."""
    from specdec_ref import speculative_generate

    model = make_model("llama", layers=1, seed=0)
    static = StaticForward(model, max_length=10)
    with pytest.raises(ValueError, match="target_model holds at most max_length=10"):
        speculative_generate(static, model, torch.tensor([[3, 4, 5]]), max_new_tokens=8)
    drafter = ModelDrafter(StaticForward(model, max_length=10), GREEDY)
    with pytest.raises(ValueError, match="draft_model holds at most max_length=10"):
        speculative_generate(model, drafter, torch.tensor([[3, 4, 5]]), max_new_tokens=8, sampling=GREEDY)
    assert static.forward_calls == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_graphs_are_captured_once_per_pass_size_and_replayed():
    """On CUDA: the first pass of each size is captured, later ones replay it, and replays
    give the eager pass's logits."""
    model = make_model("gpt2", layers=2, seed=3).to("cuda")
    static = StaticForward(model, max_length=64)
    eager = StaticForward(model, max_length=64, cuda_graphs=False, static_shapes=True)
    sequence = torch.randint(2, 48, (1, 60), generator=torch.Generator().manual_seed(0)).cuda()
    for end, m, keep in STEPS:
        ours, theirs = static.last_logits(sequence[:, :end], m), eager.last_logits(sequence[:, :end], m)
        assert torch.allclose(ours, theirs, atol=1e-5, rtol=0)
        static.rollback(keep)
        eager.rollback(keep)
    # Each size fed (all within max_graph_tokens = 16) was captured once.
    assert sorted(static.graphs) == sorted({end - keep_before for end, keep_before in _fed_sizes()})


def _fed_sizes():
    """(end, cached length before) of every pass STEPS makes."""
    length, out = 0, []
    for end, _, keep in STEPS:
        out.append((end, length))
        length = keep
    return out
