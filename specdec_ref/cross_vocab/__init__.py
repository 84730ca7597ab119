"""Drafts with a tokenizer of their own (chapter 9): exact through text or shared tokens.

* `tokenizers`: two tokenizers side by side, the tokens both spell alike (`TokenizerPair`);
* `drafting`: the drafters that cross the boundary (`TextDrafter`, `SharedVocabDrafter`);
* `law`: the exact law of the cross-tokenizer decoder, by enumeration on toy tokenizers.
"""
