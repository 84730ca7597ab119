"""A static KV cache, and decoding passes a GPU replays as CUDA graphs (chapter 6's fast path).

On a GPU a `transformers` forward pass of a model the size of GPT-2 XL is set by
kernel launches and Python, not by memory bandwidth: a one-token bf16 step of
GPT-2 XL's shape takes many times what streaming its weights needs (the H200 sweep,
`specdec_ref/data/size-sweep-cuda.json`, holds the step times). The remedy, as in PyTorch's
gpt-fast and in vLLM and SGLang, is to fix every shape and address of a decoding
pass, record its kernels once as a CUDA graph, and replay the recording: one launch
per pass instead of hundreds.

`StaticForward` is a `kv_cache.LogitsSource` (the decoder cannot tell it from
`CachedForward`):

* keys and values live in one preallocated buffer per layer, (H_kv, P, d); a pass
  writes the new tokens' columns at their positions (`index_copy_`), and
  `rollback(n)` only lowers a length: no copy, no reallocation;
* attention reads the whole buffer through a mask "column <= position", so a pass of
  m tokens has the same shapes at every length, and columns past the length (the
  rejected drafts of the last iteration) are never read;
* with `cuda_graphs`, the first pass of each size m <= `max_graph_tokens` (the
  draft's 1 and 2 tokens, the target's K + 1) is captured, after a warm-up, on
  scratch columns past `max_length` (so capturing never touches the cached tokens);
  every later pass of that size copies its token ids and positions into the graph's
  input buffers and replays it. The first pass (the prompt) and longer ones run eagerly.

What is captured, and must stay as it was: the model's weight tensors (addresses,
dtype, device), the cache buffers, and each graph's input and output buffers. Do not
move the model, change its dtype or load new weights into it after building a
`StaticForward`: the graphs would keep reading the old memory. Each call checks the
embedding's and the first layer's weights and raises a `RuntimeError` that says so
if they moved. The cache cannot grow: a sequence longer than `max_length` raises a
`ValueError` naming it; build a new `StaticForward` with a larger `max_length`.

On a CPU there are no graphs: the same code runs eagerly (`static_shapes=True` still
reads the whole buffer through the mask, which is what the tests check a graph
replays), so CI covers its logic. With `static_shapes=False` a pass attends over the
cached length only, with no mask for one token: the least work per call, which is
`lean.LeanForward`, the CPU draft's pass. Two more calls serve the tree decoder
(`tree_forward.TreeLogitsSource`): `tree_logits` feeds nodes at their own position
ids under a given mask (always eagerly), and `keep(slots)` compacts the cache to the
accepted path, whose slots are its positions again, so captured graphs stay valid.
Invariant: its logits equal `CachedForward`'s on the same model up to float rounding,
across passes, rollbacks and compactions (`tests/test_fast.py`, `tests/test_lean.py`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from ..validation import check_integer, model_device
from .blocks import check_pass, model_blocks

# Without max_length: the model's own limit, but never more than this many positions
# (a long-context model would otherwise preallocate gigabytes of cache).
DEFAULT_MAX_LENGTH = 4096


class StaticForward:
    """A causal LM with a preallocated KV cache and, on CUDA, graph-captured passes."""

    def __init__(self, model: PreTrainedModel, max_length: int | None = None, *,
                 cuda_graphs: bool | None = None, static_shapes: bool | None = None,
                 max_graph_tokens: int = 16) -> None:
        """Args:
            model: a GPT-2 or Llama-style causal LM in eval mode (`blocks.FAMILIES`).
            max_length: the most tokens a sequence may reach (default: the model's
                position limit, at most `DEFAULT_MAX_LENGTH`).
            cuda_graphs: capture and replay passes of up to `max_graph_tokens` tokens
                as CUDA graphs (default: when the model is on a CUDA device).
            static_shapes: attend over the whole cache through a mask, as a graph
                does (default: same as `cuda_graphs`); else over the cached length.
            max_graph_tokens: the longest pass that is captured (K + 1 of the
                largest K the decoder will use).

        Raises:
            TypeError: if `model` is not a `transformers` model (e.g. a `LeanForward`).
            ValueError: if the model is not supported, or an argument is out of range;
                RuntimeError: if `cuda_graphs` is asked for off a CUDA device.
        """
        if not isinstance(model, PreTrainedModel):
            raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
        device = model_device(model)
        limit = position_limit(model)
        length = min(limit, DEFAULT_MAX_LENGTH) if max_length is None else max_length
        # max_length may not pass the model's position limit.
        length = check_integer("max_length", length, minimum=1, maximum=limit)
        max_graph_tokens = check_integer("max_graph_tokens", max_graph_tokens, minimum=1)
        graphs = device.type == "cuda" if cuda_graphs is None else bool(cuda_graphs)
        if graphs and device.type != "cuda":
            raise RuntimeError(f"cuda_graphs=True needs the model on a CUDA device, it is on {device}")
        self.model = model
        self.forward_calls = 0
        self.length = 0  # tokens whose keys and values are in the cache
        self.max_length = length
        self.cuda_graphs = graphs
        self.static_shapes = graphs if static_shapes is None else bool(static_shapes)
        self.max_graph_tokens = max_graph_tokens
        # Columns [max_length, columns) are scratch: graphs are captured there.
        self.columns = length + max_graph_tokens
        self.parts = model_blocks(model, self.columns)
        weight = model.get_input_embeddings().weight
        shape = (self.parts.kv_heads, self.columns, self.parts.head_dim)
        self.keys = [weight.new_zeros(shape) for _ in self.parts.blocks]  # (H_kv, P, d) per layer
        self.values = [weight.new_zeros(shape) for _ in self.parts.blocks]
        self.arange = torch.arange(self.columns, device=device)  # (P,) positions and columns
        self.graphs: dict[int, _GraphedPass] = {}  # captured passes by their number of tokens
        self._pool = torch.cuda.graph_pool_handle() if graphs else None
        # What a graph holds by address: checked on every call.
        self._watched = [weight, next(model.parameters())]
        self._fingerprint = self._weights_fingerprint()

    @property
    def cached_length(self) -> int:
        """How many tokens of the sequence have keys and values in the cache (as
        `CachedForward.cached_length`)."""
        return self.length

    @torch.no_grad()
    def last_logits(self, sequence: torch.Tensor, num_positions: int) -> torch.Tensor:
        """Logits at the last `num_positions` positions: (1, n) -> (m, V).

        Feeds only the tokens past `length`, which must include the last
        `num_positions` positions (as `CachedForward.last_logits`).
        """
        seen = self.length
        end = check_pass(sequence, seen, num_positions, self.max_length, type(self).__name__)
        m = end - seen
        self._check_weights()
        ids = sequence[0, seen:end]  # (m,)
        # Decoding passes replay a graph; the prompt (the first pass) runs eagerly.
        if self.cuda_graphs and seen > 0 and m <= self.max_graph_tokens:
            graph = self.graphs.get(m)
            if graph is None:
                graph = self.graphs[m] = _GraphedPass(self, m)
            logits = graph.replay(ids, self.arange[seen:end])[-num_positions:].clone()  # (num_positions, V)
            self.length = end
            self.forward_calls += 1
            return logits
        # Eagerly over the whole buffer (as a graph) or the cached length only, where
        # one token sees every key and needs no mask.
        width = self.columns if self.static_shapes else end
        mask = None if width == end and m == 1 else self.arange[seen:end, None] >= self.arange[None, :width]
        return self._run(ids, slice(seen, end), slice(seen, end), width, mask, num_positions)

    @torch.no_grad()
    def tree_logits(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None,
                    num_positions: int) -> torch.Tensor:
        """Logits of the last `num_positions` of m new tokens fed after the cached ones,
        each at its own position id, each seeing the keys `mask` allows (a tree of
        drafts: `tree_forward`). Always eager, over the cached length.

        Args:
            ids: the new tokens, (m,); they take cache slots length .. length + m - 1.
            positions: their position ids, (m,).
            mask: (m, length + m) boolean, True where a row may attend (None: every key).
            num_positions: rows whose logits are returned (the last ones).
        """
        seen = self.length
        end = seen + ids.size(0)
        if end > self.max_length:
            raise ValueError(f"the cache would hold {end} entries, more than max_length={self.max_length}")
        self._check_weights()
        return self._run(ids, positions, slice(seen, end), end, mask, num_positions)

    def keep(self, slots: list[int]) -> None:
        """Keep only these cache entries (ascending), moved to slots 0 .. len(slots) - 1."""
        slots = [s for s in slots if s < self.length]
        start = next((i for i, s in enumerate(slots) if s != i), len(slots))  # a kept prefix stays
        if start < len(slots):
            index = torch.tensor(slots[start:], device=self.arange.device)
            for keys, values in zip(self.keys, self.values, strict=True):
                keys[:, start:len(slots)] = keys.index_select(1, index)  # (H_kv, kept, d)
                values[:, start:len(slots)] = values.index_select(1, index)
        self.length = len(slots)

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, width: int, keep: int | None = None) -> torch.Tensor:
        """The pass a graph captures: tokens `ids` (m,) at `positions` (m,), written at the
        columns of their positions, attending to columns [0, width) up to their own.

        Returns the logits of the last `keep` tokens (default all), (keep, V). No
        Python-side branch depends on a tensor's value, so a graph can capture it.
        """
        # Token i (at position t_i) sees every column j <= t_i: its cached prefix and the
        # new tokens before it. Columns past the length hold stale keys and stay unseen.
        mask = positions[:, None] >= self.arange[None, :width]  # (m, width)
        return self._pass(ids, positions, positions, width, mask, keep)

    def _run(self, ids: torch.Tensor, positions: torch.Tensor | slice, slots: torch.Tensor | slice, width: int,
             mask: torch.Tensor | None, keep: int) -> torch.Tensor:
        """An eager pass that moves the length past the new tokens and counts itself."""
        logits = self._pass(ids, positions, slots, width, mask, keep)
        self.length += ids.size(0)
        self.forward_calls += 1
        return logits

    def _pass(self, ids: torch.Tensor, positions: torch.Tensor | slice, slots: torch.Tensor | slice,
              width: int, mask: torch.Tensor | None, keep: int | None) -> torch.Tensor:
        """Tokens `ids` (m,) at `positions` and written at cache `slots` (each (m,) or a
        slice, the cheaper index), each attending to the columns [0, width) `mask`
        (m, width) allows (None: all); the logits of the last `keep` (default all), (keep, V)."""
        m = ids.size(0)
        parts = self.parts
        grouped = parts.kv_heads != parts.heads
        x = parts.embed(ids, self.arange[positions] if isinstance(positions, slice) else positions)  # (m, D)
        for block, keys, values, scale in zip(parts.blocks, self.keys, self.values, parts.scales, strict=True):

            def attend(q, k, v, keys=keys, values=values, scale=scale):
                if isinstance(slots, slice):
                    keys[:, slots], values[:, slots] = k, v  # (H_kv, m, d) in place
                else:
                    keys.index_copy_(1, slots, k)  # (H_kv, P, d): the new columns, in place
                    values.index_copy_(1, slots, v)
                out = F.scaled_dot_product_attention(
                    q[None], keys[None, :, :width], values[None, :, :width], attn_mask=mask, scale=scale,
                    enable_gqa=grouped)  # (1, H, m, d)
                return out[0].transpose(0, 1).reshape(m, -1)  # (m, H * d)

            x = block(x, positions, attend)
        if keep is not None:
            x = x[-keep:]
        return parts.head(x)  # (keep, V)

    def rollback(self, length: int) -> None:
        """Forget every cached token after the first `length` ones: only the length moves
        (their columns are masked until a later pass overwrites them)."""
        self.length = min(self.length, check_integer("length", length, minimum=0))

    def _weights_fingerprint(self) -> list[tuple]:
        return [(t.data_ptr(), t.dtype, t.device) for t in self._watched]

    def _check_weights(self) -> None:
        """Raise a RuntimeError if the weights moved since the cache (and graphs) were built."""
        if self._weights_fingerprint() != self._fingerprint:
            name = type(self).__name__
            raise RuntimeError(f"the model's weights moved or changed dtype since this {name} was built "
                               f"(its cache and captured graphs use the old ones); build a new {name}")


class _GraphedPass:
    """One pass of m tokens, captured as a CUDA graph with its own input and output buffers."""

    def __init__(self, source: StaticForward, m: int) -> None:
        device = source.arange.device
        self.ids = torch.zeros(m, dtype=torch.long, device=device)  # (m,)
        # Captured at scratch positions past max_length: warm-up and capture write keys
        # there, never over a cached token.
        self.positions = source.arange[source.max_length:source.max_length + m].clone()  # (m,)

        def run() -> torch.Tensor:
            return source.forward(self.ids, self.positions, source.columns)  # (m, V)

        # Warm up on a side stream (lazy initialisations, kernel selection), then capture.
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                run()
        torch.cuda.current_stream(device).wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=source._pool):
            self.logits = run()  # (m, V), overwritten by every replay

    def replay(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run the captured pass on new tokens and positions; returns its logits buffer (m, V)."""
        self.ids.copy_(ids)
        self.positions.copy_(positions)
        self.graph.replay()
        return self.logits


def position_limit(model: PreTrainedModel) -> int:
    """The most positions the model's config allows (a `StaticForward`'s longest max_length)."""
    config = model.config
    return int(getattr(config, "n_positions", None) or config.max_position_embeddings)
