"""The embedded tiny pair's recipe: corpus, configuration, training, measurement.

* `corpus`: text that ships with Python, split into train and held-out documents;
* `config`: `TrainConfig` and the two `ModelShape`s;
* `train`: tokenizer, target, distilled draft, saved in float16 (`python -m specdec_ref.training`);
* `evaluate`: held-out perplexity, acceptance and latencies, and the model card;
* `own_vocab`, `own_vocab_card`: chapter 9's draft with a tokenizer of its own (the same
  corpus, a SentencePiece-style vocabulary, trained on the text), and its card;
* `heads`, `heads_card`: draft heads on the target's own features (EAGLE's head, Medusa's
  heads, `specdec_ref.heads`), trained on features the frozen target computed once, and
  their cards, measured against the separate draft.

The chapters never import this subpackage; `models.load_pair("tiny")` loads its output.
"""
