"""The target's own features: its last hidden states, taken from the verification pass.

A draft head (Medusa, Cai et al. 2024; EAGLE, Li et al. 2024) drafts from what the
target has already computed: the hidden state h_t that the target's final norm and LM
head turn into p(x_{t+1}), here called the target's *feature* at position t. The head
needs no second target pass: `FeatureSource` is the target as a `kv_cache.LogitsSource`
(a `CachedForward`) that also keeps, for every position the cache holds, the feature
that the same forward pass computed. A hook on the final norm reads its input, so the
logits are the model's own, untouched, and the features are exactly what gave them:
logits = lm_head(norm(h)).

Invariant: `features` has one row per cached position, row t the feature at position t
of the sequence (the target has read tokens 0..t), and `rollback(n)` drops the rows of
the positions it forgets, with the cache; so after a verification the rows are those of
the accepted prefix, as a fresh pass would give them (tests/test_heads.py).

`TargetParts` holds the frozen pieces of the target a head borrows: the input
embedding, the final norm and the LM head (`logits(h) = lm_head(norm(h))`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from ..kv_cache import CachedForward

# Attribute names of the final norm on a decoder stack, family by family
# (Llama / Mistral / Qwen: norm; GPT-2 / GPT-J / Falcon: ln_f; Phi: final_layernorm).
FINAL_NORM_NAMES = ("norm", "ln_f", "final_layernorm")


def decoder_of(model: PreTrainedModel) -> nn.Module | None:
    """The model's decoder stack (`get_decoder()`, which is None for a causal LM in
    transformers 4.x; then the base model under `base_model_prefix`)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    if decoder is not None:
        return decoder
    prefix = getattr(model, "base_model_prefix", "")
    return getattr(model, prefix, None) if prefix else None


def final_norm(model: PreTrainedModel) -> nn.Module:
    """The module that normalises the last hidden state before the LM head.

    Raises:
        ValueError: naming the model's type, when its decoder has none of
            `FINAL_NORM_NAMES`.
    """
    decoder = decoder_of(model)
    for name in FINAL_NORM_NAMES:
        module = getattr(decoder, name, None)
        if isinstance(module, nn.Module):
            return module
    raise ValueError(
        f"{type(model).__name__} has no final norm named one of {FINAL_NORM_NAMES} on its "
        "decoder: draft heads read the input of the norm before the LM head")


@dataclass
class TargetParts:
    """The frozen modules of the target a head reuses (never trained, never copied)."""

    embed: nn.Module  # token ids (...,) -> embeddings (..., H)
    norm: nn.Module  # the final norm, (..., H) -> (..., H)
    lm_head: nn.Module  # (..., H) -> logits (..., V)

    @classmethod
    def of(cls, model: PreTrainedModel) -> TargetParts:
        """The embedding, final norm and LM head of `model`."""
        return cls(model.get_input_embeddings(), final_norm(model),
                   model.get_output_embeddings())

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """What the target makes of a feature: lm_head(norm(h)), (..., H) -> (..., V)."""
        return self.lm_head(self.norm(hidden))


class FeatureSource(CachedForward):
    """The target with a KV cache that also records its features.

    A `LogitsSource`: pass it to `speculative_generate` as the target, and to a
    head's drafter, which reads `features` from it. One forward pass gives both
    the logits the decoder verifies with and the features the head drafts from.
    """

    def __init__(self, model: PreTrainedModel) -> None:
        super().__init__(model)
        self.parts = TargetParts.of(model)
        hidden = model.config.hidden_size
        # (cached positions, H): row t is the feature at position t.
        self.features = torch.empty(0, hidden, dtype=model.dtype, device=model.device)
        self._captured: torch.Tensor | None = None
        # The norm's input is the feature; the hook only reads it.
        self.hook = self.parts.norm.register_forward_hook(self._capture)

    def _capture(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        if self._recording:
            self._captured = inputs[0]

    _recording = False

    @torch.no_grad()
    def last_logits(self, sequence: torch.Tensor, num_positions: int) -> torch.Tensor:
        """Logits at the last `num_positions` positions, (1, n) -> (m, V), as
        `CachedForward` gives them; the features of every position fed are
        appended to `features`."""
        self._recording, self._captured = True, None
        try:
            logits = super().last_logits(sequence, num_positions)  # (m, V)
        finally:
            self._recording = False
        if self._captured is None:
            raise RuntimeError(f"{type(self.model).__name__}'s final norm did not run on this pass")
        fed = self._captured[0].to(self.features.dtype)  # (n - seen, H)
        self.features = torch.cat([self.features, fed])  # (n, H)
        return logits

    def close(self) -> None:
        """Remove the hook from the target's final norm (the source reads no more features)."""
        self.hook.remove()

    def rollback(self, length: int) -> None:
        """Forget every cached token, and its feature, after the first `length`."""
        super().rollback(length)
        self.features = self.features[: self.cached_length]  # (length, H)
