"""One pass over a tree of drafts: tree attention, and caches that keep one path.

A tree's nodes go through a model in one pass, as a chain's drafts do, with two
changes (SpecInfer, Miao et al. 2024): a 4-D attention mask lets each node see the
committed tokens and its own ancestors only, and its position id is its depth after
the root, so its logits are those of the chain root -> node. Afterwards the cache
keeps the accepted path only: its entries are not contiguous, so each layer's keys
and values are index-selected.

Nodes are numbered level by level: node 0 is the root, the last token of the
sequence (position n - 1); node j sits in the cache at slot n - 1 + j and has
position id n - 1 + depth(j).

Two sources answer the same calls (`forward`, `keep`): `TreeForward`, any
`transformers` model and its `DynamicCache` (the teaching path), and
`LeanTreeForward`, a `TreeLogitsSource`: a logits source over preallocated
buffers that runs a tree pass and compacts in place (the fast path, chapter 6's
`fast.LeanForward` on a CPU or `fast.StaticForward` on a GPU; this module does
not import them). `tree_source` picks the one that fits.

A tree pass is exact only on a model whose attention depends on the position ids
and the mask alone. ALiBi models (MPT, Bloom, Falcon with `alibi=True`) bias each
key by its cache slot, so a node's siblings would count as distance; sliding-window
caches cannot be compacted. The families whose tree output is verified token for
token against `generate` (`tests/test_tree_families.py`) are `TREE_MODEL_TYPES`;
`tree_unsupported` says why any other model is refused, before anything runs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from transformers import DynamicCache, PreTrainedModel
from transformers.cache_utils import DynamicLayer

from ..kv_cache import forward_keywords, uses_sliding_window
from ..validation import model_device

# Model types whose tree decoding is verified token for token against `generate`
# (greedy, float32, random-init models: tests/test_tree_families.py).
TREE_MODEL_TYPES = ("codegen", "falcon", "gemma", "gpt2", "gpt_bigcode", "gpt_neox", "gptj", "llama",
                    "mistral", "olmo", "opt", "phi", "phi3", "qwen2", "qwen3", "starcoder2")
# Model types that bias attention by a key's cache slot (ALiBi), whatever the position ids.
ALIBI_MODEL_TYPES = ("bloom", "mpt")


def tree_unsupported(model: PreTrainedModel) -> str | None:
    """Why a tree pass would not be exact on `model` (None: it is verified).

    Checked from the config alone, before any pass: ALiBi first (the silent
    error), then sliding windows, then the list of verified families."""
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind in ALIBI_MODEL_TYPES or getattr(config, "alibi", False):
        return (f"model type {kind!r} biases attention by cache slot (ALiBi), not by position "
                "id, so a node's siblings would count as distance")
    window = getattr(config, "sliding_window", None)  # Qwen2 sets one that it does not use
    if uses_sliding_window(config) or (window and getattr(config, "use_sliding_window", True)):
        return (f"it uses sliding-window attention (sliding_window={window}), and the tree "
                "decoder compacts full-attention caches only")
    if kind not in TREE_MODEL_TYPES:
        return f"model type {kind!r} is not verified exact for trees (verified: {', '.join(TREE_MODEL_TYPES)})"
    return None


@dataclass
class DraftTree:
    """Drafted tokens, numbered level by level from the root, node 0."""

    tokens: list[int]  # each node's token (the root's: the last one emitted)
    parents: list[int]  # each node's parent (-1 for the root)
    depths: list[int]  # each node's depth (0 for the root)
    children: list[list[int]]  # each node's children, in the order drawn
    q: list[torch.Tensor] = field(default_factory=list)  # (V,) per parent

    @classmethod
    def rooted(cls, token: int) -> DraftTree:
        """A tree with only its root."""
        return cls([token], [-1], [0], [[]])

    def add(self, parent: int, token: int) -> None:
        """Append a child of `parent` (the next node number)."""
        self.children[parent].append(len(self.tokens))
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.children.append([])

    def lineage(self, node: int) -> list[int]:
        """The node and its ancestors, up to the root."""
        chain = [node]
        while self.parents[chain[-1]] >= 0:
            chain.append(self.parents[chain[-1]])
        return chain




def tree_attention(tree: DraftTree, before: int, start: int, first: int,
                   last: int) -> tuple[torch.Tensor, list[int]]:
    """The mask and position ids of a pass that feeds the committed tokens
    start..before - 1, then the nodes first..last - 1.

    Key j < before is committed token j; key before + k is node k (the
    root, node 0, is the last committed token, at position `before`).

    Returns:
        (allowed, shape (rows, before + last), True where a row may attend;
        each row's position id).
    """
    nodes = range(first, last)
    fed = before - start  # committed rows
    allowed = torch.zeros(fed + len(nodes), before + last, dtype=torch.bool)
    # A committed token sees every token up to itself (causal).
    causal = torch.ones(fed, before, dtype=torch.bool).tril(start)
    allowed[:fed, :before] = causal
    # A node sees the committed tokens and its own lineage only.
    allowed[fed:, :before] = True
    if len(nodes):
        lineage = [[False] * last for _ in nodes]  # (nodes, last)
        for row, node in zip(lineage, nodes, strict=True):
            for k in tree.lineage(node):
                row[k] = True
        allowed[fed:, before:] = torch.tensor(lineage)
    # Its position: its depth after the root.
    positions = list(range(start, before))
    positions += [before + tree.depths[node] for node in nodes]
    return allowed, positions


class TreeSource:
    """What both tree sources share: which committed tokens and nodes a pass
    feeds, their mask and positions. Every pass feeds the committed tokens
    the cache has not seen, except the last one, then a range of nodes,
    first..last - 1 (the root is node 0); it returns the nodes' logits."""

    forward_calls: int
    capacity: int | None = None  # the most cache entries it can hold (None: no limit)

    @property
    def cached_length(self) -> int:
        """Cache entries held (committed tokens, then tree nodes)."""
        raise NotImplementedError

    @torch.no_grad()
    def forward(self, sequence: torch.Tensor, tree: DraftTree, first: int,
                last: int) -> torch.Tensor:
        """Logits of nodes first..last - 1, shape (last - first, V).

        The cache must hold the committed tokens before the root, or only
        some of them when first == 0 (the rest are fed here, causally),
        then nodes 0..first - 1.
        """
        before = sequence.size(1) - 1  # committed tokens before the root
        seen = self.cached_length
        start = min(seen, before)  # the first committed token fed now
        if seen != (before + first if first else start):
            need = before + first if first else f"at most {before}"
            raise ValueError(f"the cache holds {seen} entries; nodes "
                             f"{first}..{last - 1} need {need}")
        allowed, positions = tree_attention(tree, before, start, first, last)
        ids = sequence[0, start:before].tolist()
        ids += [tree.tokens[node] for node in range(first, last)]
        self.forward_calls += 1
        return self._pass(ids, positions, allowed, last - first)

    def _pass(self, ids: list[int], positions: list[int],
              allowed: torch.Tensor, count: int) -> torch.Tensor:
        """The logits of the last `count` of these rows, (count, V)."""
        raise NotImplementedError

    def keep(self, slots: list[int]) -> None:
        """Keep only these cache entries (ascending), in this order."""
        raise NotImplementedError


class TreeForward(TreeSource):
    """A `transformers` model and its `DynamicCache`, fed a tree through a
    4-D mask."""

    def __init__(self, model: PreTrainedModel, name: str = "model") -> None:
        reason = tree_unsupported(model)
        if reason is not None:
            raise ValueError(f"{name} ({type(model).__name__}) cannot be decoded with a tree: "
                             f"{reason}; use speculative_generate (a chain of drafts)")
        self.model = model
        self.cache = DynamicCache(config=model.config)
        if any(type(layer) is not DynamicLayer for layer in self.cache.layers):
            raise ValueError(f"{name} ({type(model).__name__})'s cache has layers other than "
                             "DynamicLayer: the tree decoder cannot compact it")
        self.forward_calls = 0
        self._cache_kwarg, self._logits_to_keep = forward_keywords(model)

    @property
    def cached_length(self) -> int:
        return self.cache.get_seq_length()

    def _pass(self, ids: list[int], positions: list[int],
              allowed: torch.Tensor, count: int) -> torch.Tensor:
        # An additive float mask: 0 where allowed, the dtype's min elsewhere;
        # none where it is causal (a chain), so the model takes its own.
        dtype, device = self.model.dtype, self.model.device
        rows, keys = allowed.shape
        causal = torch.ones(rows, keys, dtype=torch.bool).tril(keys - rows)
        mask = None
        if not torch.equal(allowed, causal):
            mask = torch.zeros(rows, keys, dtype=dtype)  # (rows, keys)
            mask = mask.masked_fill(~allowed, torch.finfo(dtype).min)
            mask = mask[None, None].to(device)  # (1, 1, rows, keys)
        kwargs = {self._cache_kwarg: self.cache, "use_cache": True}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = count
        logits = self.model(
            torch.tensor([ids], device=device),
            attention_mask=mask,
            position_ids=torch.tensor([positions], device=device),
            **kwargs).logits  # (1, rows or count, V)
        return logits[0, -count:]  # (count, V)

    def keep(self, slots: list[int]) -> None:
        length = self.cached_length
        slots = [s for s in slots if s < length]
        if slots == list(range(len(slots))):
            if length > len(slots):
                self.cache.crop(len(slots) - length)  # a prefix: crop
            return
        device = self.cache.layers[0].keys.device
        index = torch.tensor(slots, device=device)
        for layer in self.cache.layers:
            # (B, H, length, D) -> (B, H, kept, D)
            layer.keys = layer.keys.index_select(-2, index)
            layer.values = layer.values.index_select(-2, index)


@runtime_checkable
class TreeLogitsSource(Protocol):
    """A model's cached pass over its own buffers that a tree can grow in
    (`fast.LeanForward`, `fast.StaticForward`): new tokens take the slots after
    the cached ones, at the position ids given, under the mask given."""

    model: PreTrainedModel  # the weights it runs
    max_length: int  # its buffers' columns
    length: int  # cache entries held
    forward_calls: int  # passes so far

    def tree_logits(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                    num_positions: int) -> torch.Tensor:
        """Logits (num_positions, V) of the last rows of ids (m,) at positions (m,),
        mask (m, length + m) True where a row may attend (None: every key)."""
        ...

    def keep(self, slots: list[int]) -> None:
        """Keep only these cache entries (ascending), moved to the first slots."""
        ...

    def rollback(self, length: int) -> None:
        """Forget every cache entry after the first `length`."""
        ...


class LeanTreeForward(TreeSource):
    """A `TreeLogitsSource`: the same tree pass with no framework overhead, and
    compaction inside its preallocated buffers."""

    def __init__(self, lean: TreeLogitsSource) -> None:
        self.lean = lean
        self.lean.rollback(0)  # a fresh sequence
        self.forward_calls = 0
        self.capacity = lean.max_length  # its buffers' columns
        self._device = model_device(lean.model)

    @property
    def cached_length(self) -> int:
        return self.lean.length

    def _pass(self, ids: list[int], positions: list[int],
              allowed: torch.Tensor, count: int) -> torch.Tensor:
        device = self._device
        # No mask only where every row sees every key: a one-node level
        # below a wider one must still not see its parent's siblings.
        mask = None if bool(allowed.all()) else allowed.to(device)
        return self.lean.tree_logits(torch.tensor(ids, device=device),
                                     torch.tensor(positions, device=device),
                                     mask, count)

    def keep(self, slots: list[int]) -> None:
        self.lean.keep(slots)


def tree_source(model: PreTrainedModel | TreeLogitsSource, name: str = "model") -> TreeSource:
    """The tree source for a model: the model itself when it is one (a
    `heads.trees` source), `LeanTreeForward` for a `TreeLogitsSource`
    (a `fast.LeanForward`, as `fast.prepare` makes for a draft on a CPU, or a
    `fast.StaticForward`), else `TreeForward`.

    Raises:
        TypeError: for anything else; ValueError: naming `name`, for a model
            whose tree passes are not exact (`tree_unsupported`)."""
    if isinstance(model, TreeSource):  # a source built by the caller (heads.trees)
        return model
    if isinstance(model, TreeLogitsSource):
        return LeanTreeForward(model)
    if isinstance(model, PreTrainedModel):
        return TreeForward(model, name)
    raise TypeError(f"{name} of a tree decoder must be a transformers model or a "
                    f"fast.LeanForward or fast.StaticForward, got {type(model).__name__}")
