"""Draft heads: drafting from the target's own features (Medusa, EAGLE).

* `features`: the target as a logits source that also records its last hidden states,
  from the same pass that gives p, rolled back with its cache; the target's frozen
  embedding, final norm and LM head (`TargetParts`);
* `eagle`: EAGLE's head (Li et al. 2024), one decoder layer of the target's kind that
  predicts the next feature from (feature, next token);
* `medusa`: Medusa's heads (Cai et al. 2024), K residual blocks on the last feature;
* `drafters`: both as `drafting.Drafter`s for the unchanged decoder, so chapter 4's
  rule verifies them: any q is exact.
"""
