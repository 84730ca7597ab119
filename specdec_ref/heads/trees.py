"""Draft heads growing a tree: Medusa's heads and EAGLE's head as tree sources for the unchanged
tree decoder.

A tree needs two things a chain does not (chapter 8): the target as a tree source, and a
draft that gives q at every node of a level in one pass.

* `FeatureTreeForward`: the target as chapter 8's `TreeForward` (a tree pass through a
  4-D mask) that also records, for every cache entry, the feature the same pass computed
  (the input of its final norm, as `features.FeatureSource` does for a chain). When the
  decoder keeps the committed tokens and the accepted path (`keep(slots)`), the features
  of those slots are kept with them, so after each round row t is the feature of
  position t of the output, as a fresh pass would give it.
* `MedusaTreeSource`: Medusa's heads (Cai et al. 2024) as the draft. At a round that
  starts after x_0..x_{n-1} the target has read n - 1 tokens, and head k guesses x_{n+k}
  from h_{n-2}, whatever was drafted before it: so every node at depth d gets the same q,
  head d's, and one pass through the heads serves the whole tree. Chapter 8's sibling
  rule verifies the tree; it is exact for any q at each node, so this needs nothing new.
  On the first round the target has read nothing: the draft's q is then uniform (any q
  is exact), and the round's one target pass reads the prompt.

Medusa's own trees are fixed sparse shapes of top-k candidates; here the shape is
chapter 8's `widths` (top-w children when greedy, w children drawn without replacement
when sampling), so the draft and the separate draft model grow the same trees.
"""

from __future__ import annotations

import torch
from torch import nn

from ..trees.forward import DraftTree, TreeForward, TreeSource
from .eagle import EagleHead
from .features import TargetParts
from .medusa import MedusaHeads


class FeatureTreeForward(TreeForward):
    """The target as a tree source that keeps each cache entry's feature (`features`)."""

    def __init__(self, model, name: str = "target_model") -> None:
        super().__init__(model, name)
        self.parts = TargetParts.of(model)
        # (cache entries, H): row i is the feature of the token in slot i.
        self.features = torch.empty(0, model.config.hidden_size, dtype=model.dtype, device=model.device)
        self._captured: torch.Tensor | None = None
        self.hook = self.parts.norm.register_forward_hook(self._capture)

    def _capture(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        self._captured = inputs[0]

    def _pass(self, ids: list[int], positions: list[int], allowed: torch.Tensor, count: int) -> torch.Tensor:
        self._captured = None
        logits = super()._pass(ids, positions, allowed, count)  # (count, V)
        if self._captured is None:
            raise RuntimeError(f"{type(self.model).__name__}'s final norm did not run on this pass")
        fed = self._captured[0, -len(ids):].to(self.features.dtype)  # (rows fed, H)
        self.features = torch.cat([self.features, fed])
        return logits

    def keep(self, slots: list[int]) -> None:
        held = self.features.size(0)
        super().keep(slots)
        rows = [s for s in slots if s < held]
        self.features = self.features[rows]  # (kept, H)

    def close(self) -> None:
        """Remove the hook from the target's final norm."""
        self.hook.remove()


class MedusaTreeSource(TreeSource):
    """Medusa's heads as the tree decoder's draft: the nodes of depth d get head d's q."""

    def __init__(self, heads: MedusaHeads, target: FeatureTreeForward) -> None:
        if not isinstance(target, FeatureTreeForward):
            raise TypeError("target must be the heads.trees.FeatureTreeForward passed to the tree "
                            f"decoder as target_model, got {type(target).__name__}")
        self.heads, self.target = heads, target
        self.model = target.model  # the weights the decoder checks (vocabulary, device)
        self.forward_calls = 0  # passes through the heads, one per round
        # The round's logits of every head (K, V), and the features they were read from.
        self._round: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def cached_length(self) -> int:
        return 0  # the heads keep no cache

    def _head_logits(self, sequence: torch.Tensor) -> torch.Tensor:
        """Every head's logits for the round after `sequence` (1, n): (K, V)."""
        n = sequence.size(1)
        if self._round is not None and self._round[0] is self.target.features:
            return self._round[1]  # the same round: the target has not passed since
        held = self.target.features.size(0)
        vocab = self.target.parts.lm_head.weight.size(0)
        if held == 0:  # the first round: the target has read nothing yet
            logits = torch.zeros(len(self.heads), vocab, device=self.target.features.device)
        elif held != n - 1:
            raise ValueError(f"the target holds {held} features for a sequence of {n} tokens: pass "
                             "this source's FeatureTreeForward to the tree decoder as target_model")
        else:
            feature = self.target.features[n - 2][None]  # h_{n-2}, (1, H)
            logits = torch.cat([self.heads.logits(feature, self.target.parts, k)
                                for k in range(len(self.heads))]).float()  # (K, V)
            self.forward_calls += 1
        self._round = (self.target.features, logits)
        return logits

    @torch.no_grad()
    def forward(self, sequence: torch.Tensor, tree: DraftTree, first: int, last: int) -> torch.Tensor:
        """Logits of nodes first..last - 1, (last - first, V): head d's for a node of depth d.

        Raises:
            ValueError: for a node deeper than the heads reach (len(heads) - 1).
        """
        logits = self._head_logits(sequence)  # (K, V)
        depths = tree.depths[first:last]
        if max(depths) >= len(self.heads):
            raise ValueError(f"a tree of depth {max(depths) + 1} needs {max(depths) + 1} Medusa heads, "
                             f"these have {len(self.heads)}: pass at most {len(self.heads)} widths")
        return logits[depths]  # (last - first, V)

    def keep(self, slots: list[int]) -> None:
        """Nothing to keep (the heads read the target's features afresh each round); but
        after a round the target must hold the kept slots' features.

        Raises:
            ValueError: when it holds none: the decoder's target is another source.
        """
        if slots and self.target.features.size(0) == 0:
            raise ValueError("the target holds no features after a round: pass this source's "
                             "FeatureTreeForward to the tree decoder as target_model")


class EagleTreeSource(TreeSource):
    """EAGLE's head as the tree decoder's draft: each node's feature predicted from its parent's.

    The head's cache holds one entry per pair (h_t, x_{t+1}) at position t. A round after
    x_0..x_{n-1} first feeds the pairs of the target's real features not yet read, up to
    the root's, (h_{n-2}, x_{n-1}); the root's predicted feature gives its children's q.
    A node j of depth d >= 1 is the pair (its parent's predicted feature, its token) at
    position n - 2 + d, in cache slot n - 2 + j, and sees the real entries, its ancestors
    and itself (a tree mask, as the target's pass has). After the round every entry built
    on a predicted feature is dropped (EAGLE's stable cache), so the next round reads the
    accepted positions with the target's real features.
    """

    def __init__(self, head: EagleHead, target: FeatureTreeForward, parts: TargetParts | None = None) -> None:
        if not isinstance(target, FeatureTreeForward):
            raise TypeError("target must be the heads.trees.FeatureTreeForward passed to the tree "
                            f"decoder as target_model, got {type(target).__name__}")
        self.head, self.target = head, target
        self.parts = parts or target.parts  # a reduced draft vocabulary, or the target's
        self.model = target.model  # the weights the decoder checks (vocabulary, device)
        self.cache, self.real = head.new_cache(), 0  # entries 0..real - 1 read real features
        self.forward_calls = 0  # passes through the head
        self._nodes: list[torch.Tensor] = []  # each fed node's predicted feature, (H,)
        self._blind = False  # the round's target has read nothing: a uniform q

    @property
    def cached_length(self) -> int:
        return self.cache.get_seq_length()

    def _keep_real(self, length: int) -> None:
        """Keep the first `length` entries, never one built on a predicted feature."""
        self.real = min(self.real, length)
        excess = self.cache.get_seq_length() - self.real
        if excess > 0:
            self.cache.crop(-excess)

    def _read_real(self, sequence: torch.Tensor) -> None:
        """Feed the real pairs up to the root's; the root's predicted feature is node 0's."""
        n, held = sequence.size(1), self.target.features.size(0)
        if held != n - 1:
            raise ValueError(f"the target holds {held} features for a sequence of {n} tokens: pass "
                             "this source's FeatureTreeForward to the tree decoder as target_model")
        self._keep_real(n - 2)  # at least the root's pair is fed
        start, parts = self.real, self.target.parts
        ids = sequence[:, start + 1 : n]  # x_{t+1} for t = start..n-2, (1, m)
        feats = self.target.features[start : n - 1][None].to(self.head.fc.weight.dtype)  # (1, m, H)
        positions = torch.arange(start, n - 1, device=ids.device)[None]  # (1, m)
        predicted = self.head(parts.embed(ids), feats, positions, self.cache)  # (1, m, H)
        self.real = n - 1
        self._nodes = [predicted[0, -1]]
        self.forward_calls += 1

    def _read_level(self, sequence: torch.Tensor, tree: DraftTree, first: int, last: int) -> None:
        """Feed nodes first..last - 1 (one level, depth >= 1) under the tree mask."""
        n, seen = sequence.size(1), self.cache.get_seq_length()
        if first != len(self._nodes) or seen != n - 2 + first:
            raise ValueError(f"nodes {first}..{last - 1} fed out of order: the head holds "
                             f"{len(self._nodes)} nodes and {seen} cache entries")
        rows = range(first, last)
        device = sequence.device
        ids = torch.tensor([[tree.tokens[j] for j in rows]], device=device)  # (1, m)
        feats = torch.stack([self._nodes[tree.parents[j]] for j in rows])[None]  # (1, m, H)
        positions = torch.tensor([[n - 2 + tree.depths[j] for j in rows]], device=device)  # (1, m)
        allowed = torch.zeros(len(rows), seen + len(rows), dtype=torch.bool)  # (m, keys)
        allowed[:, : n - 1] = True  # the real entries, the root's included
        for row, node in enumerate(rows):
            for ancestor in tree.lineage(node)[:-1]:  # the node and its ancestors but the root
                allowed[row, n - 2 + ancestor] = True
        predicted = self.head(self.target.parts.embed(ids), feats, positions, self.cache, allowed)
        self._nodes.extend(predicted[0])  # (m, H) row by row
        self.forward_calls += 1

    @torch.no_grad()
    def forward(self, sequence: torch.Tensor, tree: DraftTree, first: int, last: int) -> torch.Tensor:
        """Logits of nodes first..last - 1, (last - first, V), from their predicted features."""
        if first == 0:
            self._blind = self.target.features.size(0) == 0
            if self._blind:  # a new sequence: the first round drafts from a uniform q
                self.cache, self.real, self._nodes = self.head.new_cache(), 0, []
            else:
                self._read_real(sequence)
        vocab = self.target.parts.lm_head.weight.size(0)
        if self._blind:
            return torch.zeros(last - first, vocab, device=sequence.device)
        if first > 0:
            self._read_level(sequence, tree, first, last)
        return self.parts.logits(torch.stack(self._nodes[first:last])).float()  # (m, V)

    def keep(self, slots: list[int]) -> None:
        """Drop every entry built on a predicted feature (the nodes'): EAGLE's stable cache.

        Raises:
            ValueError: when the target holds no features after a round (the decoder's
                target is another source).
        """
        if slots and self.target.features.size(0) == 0:
            raise ValueError("the target holds no features after a round: pass this source's "
                             "FeatureTreeForward to the tree decoder as target_model")
        self._keep_real(self.real)
        self._nodes = []
