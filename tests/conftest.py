"""Tiny random-init models from configs (GPT-2 and Llama families); no hub, no network."""

from __future__ import annotations

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB = 48


def make_model(family: str, *, layers: int = 2, width: int = 64, vocab: int = VOCAB, seed: int = 0,
               positions: int = 512, init_range: float = 0.2):
    """A small random-init causal LM in float32, eval mode, with EOS disabled in generate.

    A wide init range spreads the logits so greedy argmax ties (which float rounding
    could flip between a one-pass and an incremental computation) do not occur.
    """
    torch.manual_seed(seed)
    if family == "gpt2":
        config = GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=width, n_layer=layers, n_head=4,
                            bos_token_id=0, eos_token_id=1, initializer_range=init_range)
        model = GPT2LMHeadModel(config)
    elif family == "llama":
        config = LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=2 * width,
                             num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                             max_position_embeddings=positions, bos_token_id=0, eos_token_id=1,
                             pad_token_id=None, initializer_range=init_range)
        model = LlamaForCausalLM(config)
    else:
        raise ValueError(family)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval()


@pytest.fixture(params=["gpt2", "llama"])
def pair(request):
    """(target, draft) of one family: the draft shares the vocabulary, has fewer layers."""
    family = request.param
    return make_model(family, layers=3, seed=1), make_model(family, layers=1, seed=2)
