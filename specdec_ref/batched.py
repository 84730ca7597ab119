"""Batched speculative decoding: many prompts, one draft pass and one target pass per step.

`batched_speculative_generate` runs the loop of `decoder.speculative_generate` for a
list of prompts at once. Each iteration drafts for every unfinished row with K batched
passes of the draft model, scores all the drafts with one batched pass of the target,
and applies the rule of `rejection.accept_reject` to every row at once
(`rejection.accept_reject_rows`, built on `residual_distribution` and `sample`). Rows accept
different numbers of drafts, so after the first iteration their lengths differ. Near
its budget a row judges only K_b < K drafts; the batch still drafts the largest K_b,
but each row is fed only its own K_b drafts (never a position past its budget, so
never past the model's context), and a row's extra drafts are neither verified nor
counted. The rule per row is that of
Leviathan et al. (2023) and Chen et al. (2023); keeping a ragged batch in step is the
problem BASS (Qian et al., 2024) solves with ragged attention kernels, solved here with
left padding, attention masks, explicit positions and one gather.

How the rows are kept in step (`BatchedForward`): the rows sit right-aligned in the
KV cache, padded on the left. Row b's cached tokens occupy its last `seen[b]` columns;
the columns to their left are padding that the attention mask hides. Every pass feeds
the same number m of new tokens to every row, with explicit position ids
(`len_b - m + j`), so padding never shifts a row's positions. A row with fewer than m
unseen tokens gives back its last cached tokens and feeds them again. Rolling back
after a rejection only lowers `seen[b]`. Before the next pass, one gather along the
cache's sequence axis moves each row's kept keys and values so they end in the last
column, and drops the columns that are padding in every row. A finished row (EOS or
budget) leaves the batch and costs no more work.

Invariant: each row's output is distributed exactly as `autoregressive_generate` with
the target model and the same `SamplingConfig` would give it. With temperature 0 it is
the target's greedy output token for token, whatever the other rows are: in float32 up
to rounding that practically never flips an argmax; in bfloat16 bitwise when the target
runs batch-invariant attention (`fast.batch_invariant`: grouped eager or row by row)
over prepacked layers, which
compute each row of a padded batch as that row alone. With sdpa attention in bfloat16 a
row's rounding depends on the padding the other rows bring, and a near-tie can flip.

Randomness: everything comes from one `generator`, in a fixed order. Each draft pass
calls `sample` once on the (B, V) draft distributions of the B unfinished rows: one
uniform per row, in batch order. Then `accept_reject_rows` draws one (B, K) block of
uniforms (row-major; slots past a row's K_b are drawn and unused) and one uniform per
row for its correction or bonus token. The same prompts, seed and arguments give the
same outputs. Which draws a row gets depends on the other rows in the batch; its law
does not.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache, PreTrainedModel

from .decoder import GenerationOutput, GenerationStats, IterationRecord, close_block
from .kv_cache import forward_keywords, sliding_layers
from .rejection import accept_reject_rows
from .sampling import SamplingConfig, logits_to_probs, sample
from .validation import as_integer, check_generation_args, check_prompts, eos_set, model_device

PAD_TOKEN = 0  # the id under padding columns; the attention mask hides it, so any valid id works


class BatchedForward:
    """One model over a batch of rows of different lengths, with or without a KV cache.

    Answers "the logits of the last m positions of every row" like
    `kv_cache.CachedForward`, for a batch whose rows fall out of step.
    """

    def __init__(self, model: PreTrainedModel, batch_size: int, use_cache: bool = True) -> None:
        self.model = model
        self.use_cache = use_cache
        self.forward_calls = 0
        self.cache = DynamicCache(config=model.config) if use_cache else None
        if use_cache and sliding_layers(self.cache):
            raise ValueError(
                f"{type(model).__name__} uses sliding-window attention, which the batched cache "
                "layout does not support; pass use_cache=False or use speculative_generate"
            )
        self._cache_kwarg, self._logits_to_keep = forward_keywords(model)
        self.width = 0  # C: columns in the cache
        self.start = [0] * batch_size  # column of each row's first cached token
        self.seen = [0] * batch_size  # tokens of each row held in the cache

    def _realign(self, keep: list[int]) -> None:
        """Keep each row's first keep[b] cached tokens, moved to end in the
        last column."""
        width = max(keep)
        start = [width - k for k in keep]
        if width == 0:
            self.cache = DynamicCache(config=self.model.config)
        elif width != self.width or start != self.start:
            # New column c of row b reads old column c + shift[b];
            # columns left of the row's tokens read anything and stay masked.
            shifts = [old - new
                      for old, new in zip(self.start, start, strict=True)]
            if len(set(shifts)) == 1:
                # Every row moves alike (a plain crop, as at batch size 1):
                # a slice.
                first = shifts[0]
                for layer in self.cache.layers:
                    layer.keys = layer.keys[:, :, first:first + width]
                    layer.values = layer.values[:, :, first:first + width]
            else:
                device = self.cache.layers[0].keys.device
                shift = torch.tensor(shifts, device=device)  # (B,)
                columns = torch.arange(width, device=device)  # (C',)
                index = (columns[None] + shift[:, None]).clamp(
                    0, self.width - 1)  # (B, C')
                for layer in self.cache.layers:
                    for name in ("keys", "values"):
                        states = getattr(layer, name)  # (B, H, C, D)
                        rows = index[:, None, :, None].expand(
                            -1, states.size(1), -1, states.size(3))
                        # (B, H, C', D)
                        setattr(layer, name, states.gather(2, rows))
        self.width, self.start, self.seen = width, start, list(keep)

    @torch.no_grad()
    def last_logits(self, rows: list[list[int]], num_positions: int) -> torch.Tensor:
        """Logits at the last `num_positions` positions of every row: B rows -> (B, num_positions, V).

        Every row is fed the same number m of tokens: at least `num_positions`, and at
        least each row's unseen tokens (those after its cached ones).
        """
        lengths = [len(row) for row in rows]
        seen = self.seen if self.use_cache else [0] * len(rows)
        m = max(num_positions, max(n - s for n, s in zip(lengths, seen, strict=True)))
        # Rows with fewer than m unseen tokens give back cached ones; rows shorter
        # than m are left-padded inside the new chunk (their cache is then empty).
        keep = [max(0, min(s, n - m)) for n, s in zip(lengths, seen, strict=True)]
        fed = [min(n, m) for n in lengths]
        if self.use_cache:
            self._realign(keep)
        device = model_device(self.model)
        chunk = [[PAD_TOKEN] * (m - f) + row[n - f:] for row, n, f in zip(rows, lengths, fed, strict=True)]
        chunk = torch.tensor(chunk, device=device)  # (B, m)
        length = torch.tensor(lengths, device=device)  # (B,)
        columns = torch.arange(m, device=device)  # (m,)
        position_ids = (length[:, None] - m + columns[None]).clamp(min=0)  # (B, m)
        mask = columns[None] >= m - torch.tensor(fed, device=device)[:, None]  # (B, m): padding is False
        kwargs = {"position_ids": position_ids, "use_cache": self.use_cache}
        if self._logits_to_keep:
            kwargs["logits_to_keep"] = num_positions
        if self.use_cache:
            cached_mask = torch.arange(self.width, device=device)[None] >= torch.tensor(
                self.start, device=device)[:, None]  # (B, C)
            mask = torch.cat([cached_mask, mask], dim=1)  # (B, C + m)
            kwargs[self._cache_kwarg] = self.cache
        self.forward_calls += 1
        logits = self.model(chunk, attention_mask=mask.long(), **kwargs).logits  # (B, num_positions or m, V)
        if self.use_cache:
            # Everything fed is now cached, right-aligned in the new last columns.
            self.width += m
            self.start = [self.width - n for n in lengths]
            self.seen = lengths
        return logits[:, -num_positions:]

    def rollback(self, keep: list[int]) -> None:
        """Forget every cached token of row b after its first keep[b] (applied at the next pass)."""
        self.seen = [min(s, k) for s, k in zip(self.seen, keep, strict=True)]

    def select(self, rows: list[int]) -> None:
        """Keep only these rows of the batch (finished rows stop costing work)."""
        if self.use_cache and self.width:
            index = torch.tensor(rows, dtype=torch.long, device=self.cache.layers[0].keys.device)
            self.cache.batch_select_indices(index)
        self.start = [self.start[b] for b in rows]
        self.seen = [self.seen[b] for b in rows]


def _judged(logits: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """The last K_max + 1 positions of each row (B, K_max + 1, V), with row b's K_b + 1
    slots (its K_b drafts end K_max - K_b positions early) moved to the front."""
    k_max = logits.size(1) - 1
    if min(ks) == k_max:
        return logits
    shift = torch.tensor([k_max - kb for kb in ks], device=logits.device)  # (B,)
    slots = (torch.arange(k_max + 1, device=logits.device)[None] + shift[:, None]).clamp(max=k_max)  # (B, K_max + 1)
    return logits.gather(1, slots[..., None].expand(-1, -1, logits.size(2)))


@torch.no_grad()
def batched_speculative_generate(
    target_model: PreTrainedModel,
    draft_model: PreTrainedModel,
    prompts: list[torch.Tensor],
    *,
    max_new_tokens: int,
    num_draft_tokens: int = 4,
    sampling: SamplingConfig = SamplingConfig(),
    generator: torch.Generator | None = None,
    eos_token_id: int | list[int] | torch.Tensor | None = None,
    use_cache: bool = True,
) -> list[GenerationOutput]:
    """`speculative_generate` for a batch of prompts of different lengths.

    Args:
        target_model, draft_model: as in `speculative_generate` (one vocabulary, one
            device; no sliding-window attention with the cache).
        prompts: 1-D integer tensors, one per row, of any lengths >= 1.
        max_new_tokens: the most tokens to add to each row (exactly this many
            unless that row emits an EOS first).
        num_draft_tokens: K >= 1 drafts per row and iteration (fewer near a row's
            budget, as in `speculative_generate`).
        sampling: temperature / top-k / top-p for both models; 0 is greedy.
        generator: the only source of randomness, consumed as the module docstring says.
        eos_token_id: a row stops right after any of these ids (None: never early).
        use_cache: keep both models' KV caches (False: re-read every row each pass).

    Returns:
        One `GenerationOutput` per prompt, in order: `.sequences` (1, n_i + new_i),
        `.stats` (its `target_calls` / `draft_calls` count the batched passes the
        row took part in) and `.trace`.

    Raises:
        ValueError / TypeError: for a malformed argument, named in the message.
    """
    k = as_integer(num_draft_tokens)
    if k is None or k < 1:
        raise (TypeError if k is None else ValueError)(
            f"num_draft_tokens must be an integer >= 1, got {num_draft_tokens!r}")
    check_prompts(prompts)
    # The shared checks (models, budget, sampling, context length) on a stand-in
    # for the longest prompt; then each prompt's device and ids, named prompts[i].
    device = model_device(target_model) if isinstance(target_model, PreTrainedModel) else None
    longest = torch.zeros(1, max(len(prompt) for prompt in prompts), dtype=torch.long, device=device)
    check_generation_args({"target_model": target_model, "draft_model": draft_model}, longest,
                          max_new_tokens, sampling, generator, k)
    check_prompts(prompts, target_model)
    eos = eos_set(eos_token_id)
    sequences = [prompt.tolist() for prompt in prompts]
    stats = [GenerationStats() for _ in prompts]
    traces: list[list[IterationRecord]] = [[] for _ in prompts]
    active = list(range(len(prompts))) if max_new_tokens > 0 else []
    target = BatchedForward(target_model, len(active), use_cache)
    draft = BatchedForward(draft_model, len(active), use_cache)
    while active:
        rows = [sequences[b] for b in active]
        # Never draft past a row's budget; the batch drafts the most any row needs.
        ks = [min(k, max_new_tokens - stats[b].new_tokens - 1) for b in active]
        k_max = max(ks)
        # 1. Draft: k_max batched passes of the small model, keeping q.
        drafted = torch.empty(len(active), 0, dtype=torch.long, device=device)  # (B, 0)
        q = []
        for _ in range(k_max):
            # A row is fed only the drafts it may judge: never a position past its budget.
            extended = [row + tokens[:kb] for row, tokens, kb in zip(rows, drafted.tolist(), ks, strict=True)]
            probs = logits_to_probs(draft.last_logits(extended, 1)[:, -1], sampling)  # (B, V)
            token = probs.argmax(-1) if sampling.greedy else sample(probs, generator)  # (B,)
            drafted = torch.cat([drafted, token.view(-1, 1).to(device)], dim=1)  # (B, i + 1)
            q.append(probs)
        # 2. Verify: one batched target pass over every row's drafts.
        extended = [row + tokens[:kb] for row, tokens, kb in zip(rows, drafted.tolist(), ks, strict=True)]
        p = logits_to_probs(_judged(target.last_logits(extended, k_max + 1), ks), sampling)  # (B, K_max + 1, V)
        q = torch.stack(q, 1) if q else p[:, :0]  # (B, K_max, V)
        # 3. Accept / reject: the rule of speculative_step, every row at once.
        emissions = accept_reject_rows(drafted, q, p, ks, generator, greedy=sampling.greedy)
        keep, still_active = [], []
        for row, (b, emitted) in enumerate(zip(active, emissions, strict=True)):
            # 4. Cut after an EOS; roll back to the prefix and the accepted drafts.
            block = close_block(emitted, len(emitted) - 1, len(sequences[b]), eos)
            sequences[b] = sequences[b] + block.emitted
            record = IterationRecord(drafted[row, :ks[row]].tolist(), block.emitted, block.num_accepted)
            traces[b].append(record)
            s = stats[b]
            s.count_block(record)
            s.target_calls += 1
            s.draft_calls += k_max
            keep.append(block.keep)
            if not block.hit_eos and s.new_tokens < max_new_tokens:
                still_active.append(row)
        target.rollback(keep)
        draft.rollback(keep)
        if len(still_active) < len(active):
            # Finished rows leave the batch: no more passes are spent on them.
            target.select(still_active)
            draft.select(still_active)
            active = [active[row] for row in still_active]
    return [GenerationOutput(torch.tensor([seq], dtype=prompt.dtype, device=prompt.device), s, trace)
            for seq, prompt, s, trace in zip(sequences, prompts, stats, traces, strict=True)]
