"""Trees of drafts (chapter 8): one target pass verifies a whole tree, exactly.

* `tree`: the tree's shape, its attention mask and position ids, the decoder
  (`tree_speculative_generate`);
* `forward`: the sources that score a tree in one pass (`TreeForward`, `TreeLogitsSource`);
* `verify`: the sibling rule (recursive rejection sampling) and its exact laws;
* `model`: chapter 6's performance model extended to trees (rank rates a_r).
"""
