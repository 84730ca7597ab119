"""Decoders with the bugs of popular repositories, for the audits to catch (tests only).

`buggy_generate` is a plain speculative loop without a cache, correct with bug=None,
with one bug otherwise; `StaleCacheForward` is a target whose cache is fed the whole
prefix again at every pass, for `speculative_generate`.
"""

from __future__ import annotations

import torch

from specdec_ref.decoder import GenerationOutput, GenerationStats, IterationRecord
from specdec_ref.kv_cache import CachedForward
from specdec_ref.rejection import residual_distribution
from specdec_ref.sampling import SamplingConfig, logits_to_probs, sample

BUGS = ("residual_p", "untempered_q", "bonus_position", "reused_uniform")


@torch.no_grad()
def buggy_generate(target, draft, input_ids, *, max_new_tokens, num_draft_tokens, sampling, generator, bug=None):
    """Speculative sampling with one bug: "residual_p" (a rejection resamples from p, the
    skipped adjustment), "untempered_q" (drafts drawn at the temperature, the rule given q
    at T = 1), "bonus_position" (the bonus drawn from p_{K-1}), "reused_uniform" (the
    residual drawn by inverse CDF in token-id order with the uniform that rejected the
    draft, which is then uniform on [p/q, 1), not on [0, 1): high ids come too often;
    first-token TV 0.083 on the tests' random 64-token pair); None: exact. Returns a
    `GenerationOutput` whose trace gives each block's emitted tokens."""
    assert bug in BUGS + (None,)
    sequence, n, trace = input_ids, input_ids.size(1), []
    while sequence.size(1) - n < max_new_tokens:
        k = min(num_draft_tokens, max_new_tokens - (sequence.size(1) - n) - 1)
        drafts, q_rule, context = [], [], sequence
        for _ in range(k):
            logits = draft(context, use_cache=False).logits[0, -1]  # (V,)
            q = logits_to_probs(logits, sampling).double()  # (V,) what the draft samples from
            x = int(sample(q, generator))
            q_rule.append(logits_to_probs(logits, SamplingConfig()).double() if bug == "untempered_q" else q)
            drafts.append(x)
            context = torch.cat([context, torch.tensor([[x]])], dim=1)
        p = logits_to_probs(target(context, use_cache=False).logits[0, -(k + 1):], sampling).double()  # (k + 1, V)
        emitted = []
        for i, x in enumerate(drafts):
            u = torch.rand((), dtype=torch.float64, generator=generator)
            if u * q_rule[i][x] < p[i, x]:
                emitted.append(x)
                continue
            after = p[i] if bug == "residual_p" else residual_distribution(p[i], q_rule[i])
            if bug == "reused_uniform":  # inverse CDF over the ids, at the rejecting u
                cdf = after.double().cumsum(0)  # (V,)
                last = int(after.nonzero().max())  # rounding may leave cdf[-1] below u
                emitted.append(min(int(torch.searchsorted(cdf, u, right=True)), last))
            else:
                emitted.append(int(sample(after, generator)))
            break
        else:
            emitted.append(int(sample(p[k - 1] if bug == "bonus_position" and k else p[k], generator)))
        sequence = torch.cat([sequence, torch.tensor([emitted])], dim=1)
        trace.append(IterationRecord(drafts, emitted, len(emitted) - 1))
    return GenerationOutput(sequence, GenerationStats(new_tokens=sequence.size(1) - n), trace)


class StaleCacheForward(CachedForward):
    """A cached target fed the whole sequence at every pass, on top of its cache: the first
    pass is right (the cache is empty), every later one sees the prefix twice."""

    @torch.no_grad()
    def last_logits(self, sequence, num_positions):
        self.forward_calls += 1
        logits = self.model(sequence, **{self._cache_kwarg: self.cache, "use_cache": True}).logits
        return logits[0, -num_positions:]
