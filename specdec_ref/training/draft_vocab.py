"""Choose the EAGLE head's reduced draft vocabulary: the most frequent tokens of the training text.

`python -m specdec_ref.training.draft_vocab` tokenizes the train side of the tiny pair's
corpus (`corpus.iter_documents(side="train")`, the text the target and the head were
trained on; never the held-out side) with the pair's tokenizer, counts every token, and
writes the ids in order of frequency, with the share of the training tokens the first
256, 512, 1,024 and 2,048 of them cover, to `pairs/tiny/eagle-head/draft_vocab.json`
(`heads.draft_vocab`). A drafter takes the first N (`load_draft_vocab(folder, N)`).
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from ..heads.draft_vocab import save_draft_vocab
from ..models import TINY_DIR, load_pair
from .corpus import CorpusConfig, iter_documents

SIZES = (256, 512, 1024, 2048)


def count_tokens(tokenizer, config: CorpusConfig = CorpusConfig()) -> Counter:
    """Occurrences of each token id over the corpus's train side."""
    counts: Counter = Counter()
    for document in iter_documents(config, side="train"):
        counts.update(tokenizer(document.text)["input_ids"])
    return counts


def choose(counts: Counter, vocab_size: int) -> tuple[list[int], dict[str, float]]:
    """Every id, most frequent first (ties by id; unseen ids last), and the share of
    the training tokens the first N cover, for N in SIZES."""
    ids = sorted(range(vocab_size), key=lambda token: (-counts.get(token, 0), token))
    total = sum(counts.values())
    covered, running = {}, 0
    for rank, token in enumerate(ids, 1):
        running += counts.get(token, 0)
        if rank in SIZES:
            covered[str(rank)] = round(running / total, 4)
    return ids, covered


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TINY_DIR / "eagle-head")
    args = parser.parse_args(argv)
    _, target, tokenizer = load_pair("tiny", device="cpu")
    counts = count_tokens(tokenizer)
    ids, covered = choose(counts, target.config.vocab_size)
    path = save_draft_vocab(args.out, ids, {"source": "the tiny corpus's train side", "training_tokens":
                                            sum(counts.values()), "train_share_covered": covered})
    print(f"wrote {path}: {covered}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
