"""Bad arguments to the fast path, the tree decoder and the audit get a ValueError or TypeError
that names the argument and what is allowed, never an AttributeError from deep inside."""

import pytest
import torch
from conftest import make_model
from transformers import Gemma2Config, Gemma2ForCausalLM, MistralConfig, MistralForCausalLM

from specdec_ref import SamplingConfig
from specdec_ref.audit_tokens import audit_every_token
from specdec_ref.fast import LeanForward, StaticForward, prepare
from specdec_ref.trees.tree import ConfidentShape, tree_speculative_generate

LLAMA = make_model("llama", layers=1, seed=1)
IDS = torch.tensor([[3, 4, 5, 6]])


def sliding(family: str):
    """A one-layer random-init model with a sliding window of 6 (every layer for Mistral)."""
    size = {"vocab_size": 48, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
            "num_attention_heads": 4, "num_key_value_heads": 2, "sliding_window": 6}
    if family == "mistral":
        return MistralForCausalLM(MistralConfig(**size)).eval()
    return Gemma2ForCausalLM(Gemma2Config(**size, head_dim=16, layer_types=["sliding_attention"])).eval()


def tree_on(model):
    return tree_speculative_generate(model, model, IDS, max_new_tokens=4, widths=(2,))


CASES = {
    "prepare strings": (lambda: prepare("a", "b"), TypeError,
                        r"draft_model must be a transformers PreTrainedModel .*got str"),
    "prepare no target": (lambda: prepare(LLAMA, None), TypeError,
                          r"target_model must be a transformers PreTrainedModel .*got NoneType"),
    "prepare a lean draft": (lambda: prepare(LeanForward(LLAMA), LLAMA), TypeError,
                             r"draft_model must be a transformers PreTrainedModel \(prepare builds the "
                             r"LeanForward.*got LeanForward"),
    "static over a lean": (lambda: StaticForward(LeanForward(LLAMA)), TypeError,
                           r"model must be a transformers PreTrainedModel, got LeanForward"),
    "prepare max_length text": (lambda: prepare(LLAMA, LLAMA, max_length="x"), ValueError,
                                r"max_length must be None or an integer >= 1, got 'x'"),
    "prepare max_length negative": (lambda: prepare(LLAMA, LLAMA, max_length=-5), ValueError,
                                    r"max_length must be None or an integer >= 1, got -5"),
    "static batch": (lambda: StaticForward(LLAMA, 16).last_logits(IDS.repeat(2, 1), 1), ValueError,
                     r"sequence must have shape \(1, n\), got \(2, 4\)"),
    "static 1-D": (lambda: StaticForward(LLAMA, 16).last_logits(IDS[0], 1), ValueError,
                   r"sequence must have shape \(1, n\), got \(4,\)"),
    "static float ids": (lambda: StaticForward(LLAMA, 16).last_logits(IDS.float(), 1), TypeError,
                         r"sequence must be an integer tensor of token ids.*float32"),
    "static rollback": (lambda: StaticForward(LLAMA, 16).rollback(-3), ValueError,
                        r"length must be an integer >= 0, got -3"),
    "lean rollback": (lambda: LeanForward(LLAMA, 16).rollback(-3), ValueError,
                      r"length must be an integer >= 0, got -3"),
    "confident shape int": (lambda: ConfidentShape(3), ValueError,
                            r"ConfidentShape needs levels, a non-empty tuple of integers >= 1 .*got 3"),
    "audit eos text": (lambda: audit_every_token(lambda ids, g: ids, LLAMA, IDS, sampling=SamplingConfig(),
                                                 max_new_tokens=2, num_runs=1, eos_token_id="x"), TypeError,
                       r"eos_token_id must be None, an integer id >= 0.*got 'x'"),
    "mistral tree": (lambda: tree_on(sliding("mistral")), ValueError,
                     r"target_model \(MistralForCausalLM\).*uses sliding-window attention \(sliding_window=6\)"),
    "gemma2 tree": (lambda: tree_on(sliding("gemma2")), ValueError,
                    r"target_model \(Gemma2ForCausalLM\).*uses sliding-window attention"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_arguments_are_named_with_what_is_allowed(case):
    """Each call raises the error type of CASES with a message naming the argument."""
    call, error, match = CASES[case]
    with pytest.raises(error, match=match):
        call()
