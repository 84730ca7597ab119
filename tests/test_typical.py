"""Medusa's typical acceptance changes the output law; chapter 4's exact rule does not."""

import torch

from specdec_ref.heads.typical import first_token_law, law_tv, typical_accepts


def _toy():
    p = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04], dtype=torch.float64)
    q = torch.tensor([0.70, 0.05, 0.05, 0.05, 0.05, 0.10], dtype=torch.float64)
    return p, q


def test_exact_rule_keeps_the_law():
    p, q = _toy()
    assert law_tv(first_token_law(p, q, "exact"), p) < 1e-12


def test_typical_rule_changes_the_law():
    p, q = _toy()
    law = first_token_law(p, q, "typical")
    assert abs(float(law.sum()) - 1) < 1e-12
    # The drafter over-proposes token 0 and the threshold accepts it whenever drafted.
    assert law_tv(law, p) > 0.1


def test_typical_accepts_reads_only_p():
    p, _ = _toy()
    drafts = torch.arange(6)
    accepted = typical_accepts(p.expand(6, 6), drafts)
    assert accepted[0] and not accepted[-1]


def test_every_token_audit_rejects_typical_and_passes_exact():
    """48 runs of 48 tokens (2,304, the recommended size) on a random 64-token target
    drafting for itself (64 positions)."""
    from specdec_ref import SamplingConfig
    from specdec_ref.audit_tokens import audit_every_token
    from specdec_ref.heads.typical import naive_generate
    from specdec_ref.laws import small_random_pair

    target, _ = small_random_pair(64)
    draft = target  # q = p: even a perfect drafter moves the law under the threshold
    prompt = torch.tensor([[1]])
    warm = SamplingConfig()
    verdicts = {}
    for rule in ("typical", "exact"):
        def generate(ids, generator, rule=rule):
            return naive_generate(target, draft, ids, num_draft_tokens=4, max_new_tokens=48,
                                  sampling=warm, generator=generator, rule=rule)
        verdicts[rule] = audit_every_token(generate, target, prompt, sampling=warm, max_new_tokens=48,
                                           num_runs=48, generator=torch.Generator().manual_seed(1))
    assert not verdicts["typical"].passed and verdicts["typical"].error is None, verdicts["typical"].summary()
    assert verdicts["exact"].passed, verdicts["exact"].summary()


def test_size_of_the_change_on_the_audited_target():
    """By enumeration, at the audited target's first token: q = p, yet TV > 0.1 from p."""
    from specdec_ref import SamplingConfig
    from specdec_ref.laws import reference_probs, small_random_pair

    target, _ = small_random_pair(64)
    with torch.no_grad():
        p = reference_probs(target(torch.tensor([[1]])).logits[0, -1], SamplingConfig())
    assert law_tv(first_token_law(p, p, "exact"), p) < 1e-12
    assert law_tv(first_token_law(p, p, "typical"), p) > 0.1
