"""A reduced draft vocabulary: the head's LM head over the N most frequent tokens only.

A head's pass ends in the target's LM head, a (V x H) matrix: on the tiny target 4,096 x
384, as costly as the head's decoder layer itself. EAGLE-3 (Li et al. 2025) drafts over a
smaller vocabulary (its `d2t` map; vLLM's `draft_id_to_target_id`): the head's logits are
computed for N chosen tokens and q is zero on every other one.

Exactness needs nothing new: chapter 4's rule holds for any q, and a q that is zero
outside the draft vocabulary is one such q. What it costs is acceptance: where the
target's next token lies outside the vocabulary, no draft can match it. So the choice is
measured (`bench.head_trees` and the heads' card): the mass of the training text the N
tokens cover, alpha, and the head's step time.

`ReducedParts` is `features.TargetParts` with the LM head cut to the chosen rows: the
drafters take it as `parts` (`EagleDrafter(head, source, parts=...)`), and nothing else
changes; the target keeps its whole vocabulary.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.nn import functional

from .features import TargetParts

VOCAB_FILE = "draft_vocab.json"  # beside a head's weights: {"ids": [...], ...}


class ReducedParts(TargetParts):
    """The target's parts, its LM head restricted to `ids`: logits are -inf elsewhere."""

    def __init__(self, parts: TargetParts, ids: torch.Tensor) -> None:
        vocab = parts.lm_head.weight.size(0)
        ids = torch.as_tensor(ids, dtype=torch.long).flatten()
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= vocab or ids.unique().numel() != ids.numel():
            raise ValueError(f"ids must be distinct token ids in [0, {vocab}), at least one; got "
                             f"{ids.numel()} ids in [{int(ids.min()) if ids.numel() else '-'}, "
                             f"{int(ids.max()) if ids.numel() else '-'}]")
        super().__init__(parts.embed, parts.norm, parts.lm_head)
        self.ids = ids.to(parts.lm_head.weight.device)  # (N,)
        self.weight = parts.lm_head.weight[self.ids]  # (N, H): a copy, made once
        self.bias = None if parts.lm_head.bias is None else parts.lm_head.bias[self.ids]
        self.vocab_size = vocab

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """lm_head(norm(h)) on the chosen rows, -inf elsewhere: (..., H) -> (..., V)."""
        small = functional.linear(self.norm(hidden), self.weight, self.bias)  # (..., N)
        full = small.new_full((*small.shape[:-1], self.vocab_size), float("-inf"))  # (..., V)
        full[..., self.ids] = small
        return full


def save_draft_vocab(folder: str | Path, ids: list[int], facts: dict) -> Path:
    """Write the draft vocabulary (most frequent first) and the facts of its choice."""
    path = Path(folder) / VOCAB_FILE
    path.write_text(json.dumps({**facts, "size": len(ids), "ids": ids}) + "\n")
    return path


def load_draft_vocab(folder: str | Path, size: int | None = None) -> torch.Tensor:
    """The first `size` ids of a saved draft vocabulary (None: all of it), (N,).

    Raises:
        ValueError: when the folder holds none, or fewer than `size` ids.
    """
    path = Path(folder) / VOCAB_FILE
    if not path.is_file():
        raise ValueError(f"no {VOCAB_FILE} in {str(folder)!r}: run python -m specdec_ref.training.draft_vocab")
    ids = json.loads(path.read_text())["ids"]
    if size is not None and not 1 <= size <= len(ids):
        raise ValueError(f"size must be in [1, {len(ids)}] for {path}, got {size!r}")
    return torch.tensor(ids[:size] if size else ids, dtype=torch.long)
