"""Accept or reject the drafts so that the output is distributed exactly as p (chapter 4).

For draft slot i, the draft sampled x ~ q_i and the target says p_i. The rule of
Leviathan et al. (2023) and Chen et al. (2023):

1. accept x with probability min(1, p_i(x) / q_i(x));
2. at the first rejection, sample a correction from the residual
   r_i = max(0, p_i - q_i) / sum(max(0, p_i - q_i)) and stop;
3. if all K drafts are accepted, sample a bonus token from p_K.

Invariant: each emitted token is distributed exactly as the target's p at its
position, because P(emit y) = min(p(y), q(y)) + (1 - beta) r(y) = p(y), with
beta = sum_x min(p(x), q(x)). `emission_distribution` computes the law of one call
by exact enumeration, so the claim can be checked to 1e-12 on small vocabularies.

`accept_reject_rows` applies the same rule to every row of a batch at once (chapter 7's
`batched`), each row judging its own number of drafts.

The source article resamples from p itself after a rejection (its residual is
p - p = 0); `accept_reject_article` keeps that rule so the book and tests can show
it is biased towards tokens that both models like.
"""

from __future__ import annotations

import math

import torch

from .sampling import draw_device, sample


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)) over the last dimension.

    Where p <= q everywhere (p == q for two distributions) the residual has no
    mass; a rejection then has probability 0, and p itself is returned so the
    result is always a distribution even when float rounding causes a
    rejection.
    """
    residual = (p - q).clamp(min=0)  # (..., V)
    mass = residual.sum(-1, keepdim=True)  # (..., 1)
    tiny = torch.finfo(residual.dtype).tiny
    return torch.where(mass > 0, residual / mass.clamp(min=tiny), p)


def _check_inputs(tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> None:
    """ValueErrors that name the argument for every malformed input."""
    if tokens.dim() != 1:
        raise ValueError(f"draft_tokens must have shape (K,), got {tuple(tokens.shape)}")
    k = tokens.numel()
    if p.dim() != 2 or p.size(0) != k + 1:
        raise ValueError(f"target_probs must have shape (K + 1, V) = ({k + 1}, V), got {tuple(p.shape)}")
    if q.shape != (k, p.size(1)):
        raise ValueError(f"draft_probs must have shape (K, V) = ({k}, {p.size(1)}), got {tuple(q.shape)}")
    if k and (int(tokens.min()) < 0 or int(tokens.max()) >= p.size(1)):
        raise ValueError(f"draft_tokens must lie in [0, {p.size(1)}), got {tokens.tolist()}")
    # Every check as one flag, read back in a single device sync.
    flags = []
    for probs in (q, p):
        flags += [~torch.isfinite(probs).all(), (probs < 0).any(), ((probs.sum(-1) - 1).abs() > 1e-3).any()]
    flags.append((q[torch.arange(k, device=q.device), tokens.to(q.device)] <= 0).any())
    nan_q, neg_q, sum_q, nan_p, neg_p, sum_p, zero_mass = torch.stack(flags).tolist()
    for name, nan, negative, unnormalized in (("draft_probs", nan_q, neg_q, sum_q),
                                              ("target_probs", nan_p, neg_p, sum_p)):
        if nan:
            raise ValueError(f"{name} contains NaN or infinite values")
        if negative:
            raise ValueError(f"{name} contains negative probabilities")
        if unnormalized:
            raise ValueError(f"every row of {name} must sum to 1")
    if zero_mass:
        raise ValueError("draft_probs gives zero mass to a drafted token: it cannot have been sampled from q")


def _check_finite(q: torch.Tensor, p: torch.Tensor) -> None:
    """The one check rows made by `sampling.logits_to_probs` can fail: a
    model that returned NaN or infinite logits. One device sync."""
    # Probabilities cannot overflow a sum: it is finite iff every entry is.
    if not math.isfinite(float(q.sum() + p.sum())):
        raise ValueError("draft_probs or target_probs contains NaN or infinite values: "
                         "did a model return non-finite logits?")


def accept_reject(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
    *,
    greedy: bool = False,
    trusted: bool = False,
) -> list[int]:
    """Run the rejection-sampling rule over one block of K drafts.

    Args:
        draft_tokens: the drafted tokens x_0 .. x_{K-1}, shape (K,).
        draft_probs: q, the draft distributions they were sampled from,
            shape (K, V).
        target_probs: p, the target distributions for the K slots and the
            bonus, shape (K + 1, V).
        generator: the only source of randomness (uniforms and samples).
        greedy: temperature 0: accept while x_i == argmax p_i, then emit
            argmax p_j.
        trusted: q and p come from `sampling.logits_to_probs` and the
            tokens were drawn from q (the decoder's own blocks): check only
            that the rows are finite, in one sync, instead of about 15
            reductions per block.

    Returns:
        The emitted tokens: the accepted drafts followed by exactly one
        correction (after a rejection) or bonus token (after K acceptances);
        1 to K + 1 tokens.

    Raises:
        ValueError: on wrong shapes, NaN / negative / unnormalized rows, or a
            drafted token that has zero mass under q.
    """
    if trusted:
        _check_finite(draft_probs, target_probs)
    else:
        _check_inputs(draft_tokens, draft_probs, target_probs)
    k = draft_tokens.numel()
    if greedy:
        # Greedy: the target would have emitted argmax p_i; keep drafts
        # while they agree.
        target_choice = target_probs.argmax(-1).tolist()  # K + 1 ints
        drafts = draft_tokens.tolist()
        n = next((i for i in range(k) if drafts[i] != target_choice[i]), k)
        return drafts[:n] + [target_choice[n]]
    # Work in float64 on the generator's device: the comparisons are tiny.
    device = draw_device(generator)
    rows = torch.arange(k, device=draft_probs.device)
    tokens = draft_tokens.to(draft_probs.device)
    px = target_probs[:k][rows, tokens]  # (K,) p_i(x_i)
    qx = draft_probs[rows, tokens]  # (K,) q_i(x_i)
    px, qx = px.to(device, torch.float64), qx.to(device, torch.float64)
    # Accept x_i iff u_i * q_i(x_i) < p_i(x_i), i.e. u_i < p/q: probability
    # min(1, p/q). The strict "<" matters: a uniform can be exactly 0, and
    # 0 < 0 rejects a token the target gives no mass at all.
    u = torch.rand(k, dtype=torch.float64, device=device,
                   generator=generator)  # (K,)
    accepted = (u * qx < px).tolist()
    n = next((i for i in range(k) if not accepted[i]), k)
    if n < k:
        # First rejection at slot n: the correction comes from the residual.
        residual = residual_distribution(target_probs[n].double(),
                                         draft_probs[n].double())  # (V,)
        last = sample(residual, generator)
    else:
        # All K accepted: the bonus token comes from p_K, already computed.
        last = sample(target_probs[k], generator)
    return draft_tokens[:n].tolist() + [int(last)]


def accept_reject_rows(
    drafted: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    num_drafts: list[int],
    generator: torch.Generator | None = None,
    *,
    greedy: bool = False,
) -> list[list[int]]:
    """`rejection.accept_reject` for every row of a batch at once.

    Row b judges only its first num_drafts[b] drafts (fewer than K near its
    budget): accept x_i with probability min(1, p_i(x_i) / q_i(x_i)); at the first
    rejection emit a token of `residual_distribution(p_i, q_i)`; after K_b
    acceptances emit the bonus token from p_{K_b}. Greedy: keep drafts while they
    are the argmax of p, then emit the argmax.

    Args:
        drafted: the drafted tokens, shape (B, K).
        draft_probs: q, shape (B, K, V).
        target_probs: p, shape (B, K + 1, V).
        num_drafts: K_b <= K for each row.
        generator: draws one (B, K) block of uniforms, then one token per row.
        greedy: temperature 0.

    Returns:
        For each row, the accepted drafts followed by one correction or bonus token.
    """
    batch, k = drafted.shape
    device = target_probs.device
    rows = torch.arange(batch, device=device)  # (B,)
    limit = torch.tensor(num_drafts, device=device)  # (B,)
    if greedy:
        choice = target_probs.argmax(-1)  # (B, K + 1)
        accepted = drafted == choice[:, :k]  # (B, K)
    else:
        # Accept x_i iff u_i * q_i(x_i) < p_i(x_i), in float64 on the generator's
        # device, with the strict "<" of accept_reject.
        where = draw_device(generator)
        px = target_probs[:, :k].gather(-1, drafted[..., None]).squeeze(-1)  # (B, K)
        qx = draft_probs.gather(-1, drafted[..., None]).squeeze(-1)  # (B, K)
        u = torch.rand(batch, k, dtype=torch.float64, device=where, generator=generator)  # (B, K)
        accepted = (u * qx.to(where, torch.float64) < px.to(where, torch.float64)).to(device)  # (B, K)
    # n_b: drafts accepted before the first rejection, slots past K_b never count.
    accepted &= torch.arange(k, device=device)[None] < limit[:, None]  # (B, K)
    n = accepted.long().cumprod(-1).sum(-1)  # (B,)
    p_n = target_probs[rows, n]  # (B, V): p at the first rejected slot, or p_{K_b}
    if greedy:
        last = p_n.argmax(-1)  # (B,)
    else:
        after = p_n.double()  # (B, V) the bonus distribution after K_b acceptances
        if k:
            # Rejected at slot n_b < K_b: the correction comes from the residual.
            q_n = draft_probs[rows, n.clamp(max=k - 1)].double()  # (B, V)
            residual = residual_distribution(p_n.double(), q_n)  # (B, V)
            after = torch.where((n < limit)[:, None], residual, after)
        last = sample(after, generator)  # (B,)
    counts, drafts, last = n.tolist(), drafted.tolist(), last.tolist()
    return [row[:count] + [token] for row, count, token in zip(drafts, counts, last, strict=True)]


def accept_reject_article(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: torch.Generator | None = None,
) -> list[int]:
    """The source article's rule: like `accept_reject`, but resample from p
    after a rejection. Biased; kept only so the book and the tests can show
    that it is."""
    _check_inputs(draft_tokens, draft_probs, target_probs)
    k = draft_tokens.numel()
    device = draw_device(generator)
    for i in range(k):
        x = int(draft_tokens[i])
        u = torch.rand((), dtype=torch.float64, device=device,
                       generator=generator)
        if not u * float(draft_probs[i, x]) < float(target_probs[i, x]):
            # Rejected: the article draws from p itself, not the residual.
            correction = int(sample(target_probs[i], generator))
            return draft_tokens[:i].tolist() + [correction]
    bonus = int(sample(target_probs[k], generator))
    return draft_tokens.tolist() + [bonus]


def emission_distribution(
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    rule: str = "exact",
) -> dict[tuple[int, ...], float]:
    """The exact law of what one `accept_reject` call emits, by enumeration.

    The drafts x_0 .. x_{K-1} are drawn from the fixed rows q_0 .. q_{K-1}.
    Every emitted sequence is a run of accepted drafts plus one correction or
    bonus token; its probability is summed over all ways to produce it, in
    float64.

    Args:
        draft_probs: q, shape (K, V). Keep V ** K small (it is enumerated).
        target_probs: p, shape (K + 1, V).
        rule: "exact" (residual after a rejection) or "article" (p after a
            rejection).

    Returns:
        {emitted tokens: probability}; the probabilities sum to 1.
    """
    if rule not in ("exact", "article"):
        raise ValueError(f"rule must be 'exact' or 'article', got {rule!r}")
    q, p = draft_probs.double(), target_probs.double()
    k, v = q.shape
    law: dict[tuple[int, ...], float] = {}

    def add(tokens: tuple[int, ...], mass: float) -> None:
        if mass > 0:
            law[tokens] = law.get(tokens, 0.0) + mass

    def walk(i: int, accepted: tuple[int, ...], reach: float) -> None:
        # `reach`: probability that drafts x_0 .. x_{i-1} == accepted were
        # drawn and accepted.
        if i == k:
            # Every draft accepted: the bonus token from p_K.
            for y in range(v):
                add(accepted + (y,), reach * float(p[k, y]))
            return
        if rule == "exact":
            after_reject = residual_distribution(p[i], q[i])  # (V,)
        else:
            after_reject = p[i]  # the article's: p itself
        for x in range(v):
            drawn = reach * float(q[i, x])
            if drawn == 0:
                continue
            accept = min(1.0, float(p[i, x]) / float(q[i, x]))
            # Rejected at slot i: one token from the residual (or p), stop.
            rejected = drawn * (1 - accept)
            for y in range(v):
                add(accepted + (y,), rejected * float(after_reject[y]))
            walk(i + 1, accepted + (x,), drawn * accept)

    walk(0, (), 1.0)
    return law


def next_token_law(
    law: dict[tuple[int, ...], float], prefix: tuple[int, ...], vocab_size: int
) -> torch.Tensor:
    """Distribution of the emitted token after `prefix`, given the emission
    starts with `prefix` as accepted drafts (so it is longer than the prefix).
    Shape (V,), float64."""
    out = torch.zeros(vocab_size, dtype=torch.float64)
    for seq, mass in law.items():
        if len(seq) > len(prefix) and seq[: len(prefix)] == prefix:
            out[seq[len(prefix)]] += mass
    total = out.sum()
    if total <= 0:
        raise ValueError(f"prefix {prefix} is never emitted as accepted drafts")
    return out / total
