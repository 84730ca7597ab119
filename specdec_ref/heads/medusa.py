"""Medusa's heads: K independent guesses of the next K tokens from one feature.

Medusa (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads") puts K small heads on the target's last hidden state. At
position t the target's own LM head gives p(x_{t+1}); head k (k = 1..K) guesses
x_{t+1+k}, the token k places further on, from the same feature h_t. Each head is one
residual block, z + SiLU(W z + b) on the normalised feature z = norm(h_t), followed by
the target's own LM head; W starts at zero, so an untrained head repeats the target's
prediction (Medusa-1's initialisation).

The heads never see the tokens drafted before theirs: head k guesses x_{t+1+k} without
knowing what was drafted at t + 2 .. t + k, so later heads guess worse (Medusa's own
measurements: top-1 0.56, 0.32, 0.20, 0.15, 0.12 on Vicuna-7B). That is no threat to
exactness: chapter 4's rule is exact for any q, including a q that ignores the earlier
drafts. Invariant: head k's q depends on the prefix alone (through h_t).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import PreTrainedModel

from .features import TargetParts

HEADS_FILE = "heads.safetensors"  # the trained blocks, float16
CONFIG_FILE = "config.json"  # how many heads, the width and vocabulary they fit


class ResidualBlock(nn.Module):
    """z + SiLU(W z + b), with W zero at the start: the identity."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, hidden)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        """(..., H) -> (..., H)."""
        return z + nn.functional.silu(self.linear(z))


class MedusaHeads(nn.Module):
    """K residual blocks; head k's logits are lm_head(block_k(norm(h)))."""

    def __init__(self, hidden: int, num_heads: int, vocab_size: int) -> None:
        super().__init__()
        if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1:
            raise ValueError(f"num_heads must be an integer >= 1, got {num_heads!r}")
        self.hidden, self.vocab_size = hidden, vocab_size
        self.blocks = nn.ModuleList(ResidualBlock(hidden) for _ in range(num_heads))

    @classmethod
    def for_target(cls, target: PreTrainedModel, num_heads: int = 4) -> MedusaHeads:
        """Fresh heads (each the identity) for `target`, in its dtype and device."""
        heads = cls(target.config.hidden_size, num_heads, target.config.vocab_size)
        return heads.to(device=target.device, dtype=target.dtype)

    def __len__(self) -> int:
        return len(self.blocks)

    def logits(self, features: torch.Tensor, parts: TargetParts, k: int) -> torch.Tensor:
        """Head k's logits (k = 0 guesses the token after the target's next one).

        Args:
            features: the target's features h_t, shape (..., H).
            parts: the target's final norm and LM head.
            k: which head, 0 <= k < len(self).

        Returns:
            logits for x_{t+2+k}, shape (..., V).
        """
        return parts.lm_head(self.blocks[k](parts.norm(features)))  # (..., V)

    def save(self, folder: str | Path, extra: dict | None = None) -> None:
        """Write the heads to `folder`: float16 weights and their config (plus `extra` facts)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        state = {name: tensor.detach().to("cpu", torch.float16).contiguous()
                 for name, tensor in self.state_dict().items()}
        save_file(state, folder / HEADS_FILE)
        record = {"kind": "medusa", "num_heads": len(self), "hidden_size": self.hidden,
                  "vocab_size": self.vocab_size, **(extra or {})}
        (folder / CONFIG_FILE).write_text(json.dumps(record, indent=2, default=str) + "\n")

    @classmethod
    def load(cls, folder: str | Path, target: PreTrainedModel) -> MedusaHeads:
        """Heads saved by `save`, for `target`, in its dtype and device.

        Raises:
            ValueError: when the folder holds no Medusa heads, or heads of another
                width or vocabulary than the target's.
        """
        folder = Path(folder)
        if not (folder / HEADS_FILE).is_file() or not (folder / CONFIG_FILE).is_file():
            raise ValueError(f"folder {str(folder)!r} has no {HEADS_FILE} and {CONFIG_FILE}: not saved heads")
        record = json.loads((folder / CONFIG_FILE).read_text())
        for key in ("hidden_size", "vocab_size"):
            if record.get("kind") != "medusa" or record.get(key) != getattr(target.config, key):
                raise ValueError(f"the heads in {str(folder)!r} ({record.get('kind')}, {key}="
                                 f"{record.get(key)}) do not fit the target ({key}="
                                 f"{getattr(target.config, key)})")
        heads = cls.for_target(target, record["num_heads"])
        state = load_file(folder / HEADS_FILE)
        heads.load_state_dict({name: tensor.to(target.dtype) for name, tensor in state.items()})
        return heads.eval()
