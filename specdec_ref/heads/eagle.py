"""EAGLE's draft head: one decoder layer that drafts on the target's own features.

EAGLE (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty") drafts at the level of features rather than tokens. At position t the
head reads the target's feature h_t (`features`: the input of the final norm) and the
embedding of the token that follows, x_{t+1}; it fuses the two with one linear layer,
runs one decoder layer of the target's own kind (here transformers' class, built from
the target's config), and predicts the next feature, h^_{t+1}. The target's frozen
final norm and LM head turn it into logits: q(x_{t+2}) = softmax(lm_head(norm(h^))).
Drafting is autoregressive: the predicted feature and the drafted token are the next
input (`eagle_drafter`).

Trained (`training.heads`) by regressing h^_{t+1} on the target's h_{t+1} (compared
after the final norm, what the LM head sees) plus a cross-entropy against the target's
p: EAGLE-1's loss. A head that predicted every feature exactly would give q = p.

Here the head is only the trainable part: its norms, the fusing layer and the decoder
layer (its rotary embedding has no weights). The embedding, final norm and LM head stay
the target's (`features.TargetParts`), so a saved head holds none of them.
Invariant: over a cache, feeding positions one at a time or all at once gives the same
predicted features (the layer is causal; tests/test_heads.py).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import DynamicCache, PreTrainedModel

from .features import decoder_of

HEAD_FILE = "head.safetensors"  # the trained weights, float16
CONFIG_FILE = "config.json"  # the head's decoder-layer config and what it was built for


def head_config(target: PreTrainedModel, intermediate_size: int | None = None):
    """The target's config cut to one layer (optionally a narrower MLP), with SDPA attention."""
    config = type(target.config).from_dict(target.config.to_dict())
    config.num_hidden_layers = 1
    if intermediate_size is not None:
        config.intermediate_size = intermediate_size
    config._attn_implementation = "sdpa"
    return config


class EagleHead(nn.Module):
    """The trainable head: fuse (embedding, feature), one decoder layer, a predicted feature.

    Built by `EagleHead.for_target(target)`, which takes the decoder-layer and rotary
    classes from the target itself, so the layer is "of the target's kind".
    """

    def __init__(self, config, layer_class: type[nn.Module], rotary_class: type[nn.Module]) -> None:
        super().__init__()
        self.config = config
        hidden = config.hidden_size
        eps = getattr(config, "rms_norm_eps", 1e-6)
        # Each input normalised first: the feature's scale (pre-norm) is far
        # from the embedding's.
        self.embed_norm = nn.RMSNorm(hidden, eps=eps)
        self.feature_norm = nn.RMSNorm(hidden, eps=eps)
        self.fc = nn.Linear(2 * hidden, hidden)  # (2H -> H), EAGLE's fusing layer
        self.layer = layer_class(config, layer_idx=0)
        self.rotary = rotary_class(config)
        parameters = inspect.signature(self.layer.forward).parameters
        self._cache_kwarg = "cache" if "cache" in parameters else "past_key_values"

    @classmethod
    def for_target(cls, target: PreTrainedModel, intermediate_size: int | None = None) -> EagleHead:
        """A randomly initialised head for `target` (seed torch first for a fixed one).

        Raises:
            ValueError: when the target's decoder has no `layers` and `rotary_emb`
                (the Llama family's layout) to take the head's classes from.
        """
        decoder = decoder_of(target)
        layers, rotary = getattr(decoder, "layers", None), getattr(decoder, "rotary_emb", None)
        if layers is None or rotary is None:
            raise ValueError(f"{type(target).__name__} has no decoder.layers and decoder.rotary_emb: "
                             "the EAGLE head builds its layer from a Llama-family target")
        head = cls(head_config(target, intermediate_size), type(layers[0]), type(rotary))
        head.layer.apply(target._init_weights)  # the target's own initialisation
        return head.to(device=target.device, dtype=target.dtype)

    def new_cache(self) -> DynamicCache:
        """An empty KV cache for the head's one layer."""
        return DynamicCache(config=self.config)

    def forward(self, embeds: torch.Tensor, features: torch.Tensor, position_ids: torch.Tensor,
                cache: DynamicCache | None = None, allowed: torch.Tensor | None = None) -> torch.Tensor:
        """Predicted features h^_{t+1} from (embedding of x_{t+1}, feature h_t).

        Args:
            embeds: embeddings of the tokens x_{t+1}, shape (B, T, H).
            features: the features h_t (the target's, or the head's own), (B, T, H).
            position_ids: t for each row, shape (B, T).
            cache: the head's KV cache (None: a causal pass over T alone).
            allowed: which keys each row sees, (T, cached + T) booleans (a tree's
                mask, `heads.trees`); None: every cached key, then causal.

        Returns:
            The predicted features, shape (B, T, H).
        """
        x = self.fc(torch.cat([self.embed_norm(embeds), self.feature_norm(features)], -1))  # (B, T, H)
        mask = None
        seen = cache.get_seq_length() if cache is not None else 0
        if allowed is not None:
            mask = torch.zeros(allowed.shape, dtype=x.dtype, device=x.device)
            mask = mask.masked_fill(~allowed.to(x.device), torch.finfo(x.dtype).min)[None, None]
        elif cache is not None and seen and x.size(1) > 1:
            # New rows see every cached key and the new rows up to themselves
            # (SDPA's own causal flag would align the triangle to the top left).
            rows, keys = x.size(1), seen + x.size(1)
            allowed = torch.ones(rows, keys, dtype=torch.bool, device=x.device).tril(seen)  # (T, seen + T)
            mask = torch.zeros(rows, keys, dtype=x.dtype, device=x.device)
            mask = mask.masked_fill(~allowed, torch.finfo(x.dtype).min)[None, None]  # (1, 1, T, seen + T)
        position_embeddings = self.rotary(x, position_ids)
        kwargs = {self._cache_kwarg: cache, "use_cache": cache is not None}
        out = self.layer(x, attention_mask=mask, position_ids=position_ids,
                         position_embeddings=position_embeddings, **kwargs)
        return out[0] if isinstance(out, tuple) else out  # (B, T, H)

    def save(self, folder: str | Path, extra: dict | None = None) -> None:
        """Write the head to `folder`: float16 weights and its config (plus `extra` facts)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {name: tensor.detach().to("cpu", torch.float16).contiguous()
                 for name, tensor in self.state_dict().items()}
        save_file(state, folder / HEAD_FILE)
        record = {"kind": "eagle", "layer": self.config.to_dict(), **(extra or {})}
        (folder / CONFIG_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n")

    @classmethod
    def load(cls, folder: str | Path, target: PreTrainedModel) -> EagleHead:
        """A head saved by `save`, for `target`, in the target's dtype and device.

        Raises:
            ValueError: when the folder holds no EAGLE head, or one built for a
                target of another width or vocabulary.
        """
        folder = Path(folder)
        if not (folder / HEAD_FILE).is_file() or not (folder / CONFIG_FILE).is_file():
            raise ValueError(f"folder {str(folder)!r} has no {HEAD_FILE} and {CONFIG_FILE}: not a saved head")
        record = json.loads((folder / CONFIG_FILE).read_text())
        layer = record.get("layer", {})
        for key in ("hidden_size", "vocab_size"):
            if record.get("kind") != "eagle" or layer.get(key) != getattr(target.config, key):
                raise ValueError(f"the head in {str(folder)!r} ({record.get('kind')}, {key}="
                                 f"{layer.get(key)}) does not fit the target ({key}="
                                 f"{getattr(target.config, key)})")
        head = cls.for_target(target, layer.get("intermediate_size"))
        state = load_file(folder / HEAD_FILE)
        head.load_state_dict({name: tensor.to(target.dtype) for name, tensor in state.items()})
        return head.eval()
