"""Trees per model family: greedy equals `generate` on every verified family; ALiBi and
unverified families are refused by name, before any pass."""

import pytest
import torch
from conftest import noisy_copy
from transformers import AutoConfig, AutoModelForCausalLM

from specdec_ref import SamplingConfig
from specdec_ref.trees.forward import TREE_MODEL_TYPES
from specdec_ref.trees.tree import tree_speculative_generate

GREEDY = SamplingConfig(temperature=0.0)
VOCAB = 48
# Tiny configs by model type: 2 layers, width 64, 4 heads, 256 positions.
SIZE = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "max_position_embeddings": 256}
GPT = {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": 256}
CONFIGS = {
    "codegen": {**GPT, "n_ctx": 256, "rotary_dim": 8},
    "falcon": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "alibi": False},
    "gemma": {**SIZE, "num_key_value_heads": 2, "head_dim": 16},
    "gpt2": GPT,
    "gpt_bigcode": GPT,
    "gpt_neox": SIZE,
    "gptj": {**GPT, "rotary_dim": 8},
    "llama": {**SIZE, "num_key_value_heads": 2},
    "mistral": {**SIZE, "num_key_value_heads": 2, "sliding_window": None},
    "olmo": SIZE,
    "opt": {"hidden_size": 64, "ffn_dim": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
            "max_position_embeddings": 256, "word_embed_proj_dim": 64},
    "phi": SIZE,
    "phi3": {**SIZE, "num_key_value_heads": 2},
    "qwen2": {**SIZE, "num_key_value_heads": 2},
    "qwen3": {**SIZE, "num_key_value_heads": 2, "head_dim": 16},
    "starcoder2": {**SIZE, "num_key_value_heads": 2, "sliding_window": None},
}
# Refused: ALiBi biases attention by cache slot; GPT-Neo's local layers are not verified.
REFUSED = {
    "mpt": ({"d_model": 64, "n_layers": 2, "n_heads": 4, "max_seq_len": 256}, "ALiBi"),
    "bloom": ({"hidden_size": 64, "n_layer": 2, "n_head": 4}, "ALiBi"),
    "falcon": ({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "alibi": True}, "ALiBi"),
    "gpt_neo": ({"hidden_size": 64, "num_layers": 2, "num_heads": 4, "max_position_embeddings": 256,
                 "attention_types": [[["global", "local"], 1]]}, "not verified"),
}


def family_model(model_type: str, settings: dict, seed: int = 1):
    """A random-init float32 model of `model_type` on VOCAB tokens, spread logits, no EOS."""
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, vocab_size=VOCAB, bos_token_id=0, eos_token_id=1, pad_token_id=0,
                                  **settings)
    if hasattr(config, "initializer_range"):
        config.initializer_range = 0.2  # no greedy near-ties
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def test_every_verified_family_has_a_test():
    """TREE_MODEL_TYPES is exactly the families tested here: the list cannot grow untested."""
    assert set(TREE_MODEL_TYPES) == set(CONFIGS)


@pytest.mark.parametrize("model_type", sorted(CONFIGS))
def test_tree_greedy_matches_generate_per_family(model_type):
    """float32, widths (3, 2, 1), a noisy-copy draft: the tree's tokens are the target's greedy ones."""
    target = family_model(model_type, CONFIGS[model_type])
    draft = noisy_copy(target, noise=0.3, seed=3)
    prompt = torch.tensor([[3, 4, 5, 6, 7, 8]])
    expected = target.generate(prompt, max_new_tokens=40, min_new_tokens=40, do_sample=False)
    out = tree_speculative_generate(target, draft, prompt, max_new_tokens=40, widths=(3, 2, 1), sampling=GREEDY)
    assert torch.equal(out.sequences, expected)
    assert 0 < out.stats.accepted_tokens


@pytest.mark.parametrize("role", ["target_model", "draft_model"])
@pytest.mark.parametrize("name", ["mpt", "bloom", "falcon", "gpt_neo"])
def test_unverified_families_are_refused_before_any_pass(name, role):
    """MPT, Bloom, Falcon with ALiBi (by cache slot: siblings count as distance), and a family not
    verified: a ValueError naming the argument, the model type and why; no model has run."""
    settings, why = REFUSED[name]
    refused = family_model(name, settings)
    other = family_model("llama", CONFIGS["llama"])
    calls = []
    for model in (refused, other):
        model.register_forward_pre_hook(lambda *_: calls.append(1))
    models = {"target_model": other, "draft_model": other, role: refused}
    with pytest.raises(ValueError, match=f"{role} .*model type '{name}'.*{why}"):
        tree_speculative_generate(models["target_model"], models["draft_model"], torch.tensor([[3, 4, 5]]),
                                  max_new_tokens=10, widths=(2, 2), sampling=GREEDY)
    assert not calls
