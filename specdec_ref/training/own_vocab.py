"""Train a draft with a tokenizer of its own, for the cross-tokenizer chapter.

`python -m specdec_ref.training.own_vocab` writes `specdec_ref/pairs/tiny/own-vocab-draft`:
a draft of the tiny draft's shape trained on the same corpus, but through another
vocabulary, the kind a Llama-family model has where the tiny target has a GPT-2 one:

* a SentencePiece-style BPE (`tokenizers`): a space is the piece "▁" and belongs to
  the word after it, runs of spaces before a word are one piece, and a character
  outside the 100 most frequent falls back to its UTF-8 bytes (`<0xE2>`, ...);
* 3072 tokens (the target has 4096): 3 special tokens (`<unk>`, `<s>`, `</s>`, so
  even the end of text is spelled differently), the 256 byte tokens, and merges;
* the draft trained on the text with cross-entropy, not on the target's labels: it
  never saw the target, as a small model of another family never has.

Invariant: `decode(encode(text)) == text` for any text without the character "▁"
(the byte tokens spell every other character), so the draft can read any context the
target wrote. The card (`README.md`, `metrics.json` beside the weights) is written by
`specdec_ref.vocab_card` from measurements, never by hand.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast

from ..cross_vocab.tokenizers import PIECES
from .config import DEFAULT_OUT, TrainConfig
from .corpus import CorpusConfig, load_corpus
from .train import build_model, encode, num_params, save_half, train_model

OWN_VOCAB_DIR = DEFAULT_OUT / "own-vocab-draft"
SPECIALS = ["<unk>", "<s>", "</s>"]
BYTES = [f"<0x{b:02X}>" for b in range(256)]


def train_sentencepiece_bpe(texts: list[str], vocab_size: int, context: int,
                            alphabet: int = 100) -> PreTrainedTokenizerFast:
    """A byte-fallback BPE over "▁"-spaced pieces, wrapped for `transformers`."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    def pipeline(model: models.Model) -> Tokenizer:
        tokenizer = Tokenizer(model)
        tokenizer.normalizer = normalizers.Replace(" ", "▁")
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(PIECES), behavior="isolated")
        tokenizer.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                               decoders.Fuse()])
        return tokenizer

    # 1. Learn merges over the frequent characters only; the rest will be bytes.
    first = pipeline(models.BPE())
    reserved = len(SPECIALS) + len(BYTES)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - reserved, limit_alphabet=alphabet,
                                  show_progress=False)
    first.train_from_iterator(texts, trainer=trainer)
    learned = json.loads(first.to_str())["model"]
    # 2. The final vocabulary: specials, the 256 bytes, then the learned pieces in order.
    pieces = sorted(learned["vocab"], key=learned["vocab"].get)
    vocab = {token: i for i, token in enumerate(SPECIALS + BYTES + pieces)}
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    tokenizer = pipeline(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>"))
    tokenizer.add_special_tokens(SPECIALS)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>",
                                   eos_token="</s>", pad_token="</s>", model_max_length=context)


def main(argv: list[str] | None = None) -> dict:
    """Command line: tokenizer, draft, saved in float16 beside the tiny pair."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OWN_VOCAB_DIR)
    parser.add_argument("--steps", type=int, default=1800)
    parser.add_argument("--vocab-size", type=int, default=3072)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--quick", action="store_true", help="a smoke run: a small corpus and 4 steps")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    config = TrainConfig(out_dir=args.out, draft_steps=args.steps, vocab_size=args.vocab_size,
                         distill=False, device="cpu")
    if args.quick:
        config = replace(config, draft_steps=4, warmup_steps=2, batch_size=2, context=64,
                         corpus=CorpusConfig(max_documents=120))
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    corpus = load_corpus(config.corpus)
    tokenizer = train_sentencepiece_bpe([d.text for d in corpus.train], config.vocab_size, config.context)
    train_ids = encode(tokenizer, [d.text for d in corpus.train])  # (N_train,)
    data_seconds = time.perf_counter() - t0
    print(f"own vocabulary: {len(tokenizer)} tokens, {train_ids.numel()} train tokens "
          f"({data_seconds:.0f} s)", file=sys.stderr)
    with open(out / "training_log.csv", "w", newline="", buffering=1) as handle:
        log = csv.writer(handle)
        log.writerow(["stage", "step", "loss", "lr", "tokens", "seconds"])
        draft = build_model(config.draft, tokenizer, config.context, config.seed + 1)
        draft.config.bos_token_id = draft.generation_config.bos_token_id = tokenizer.bos_token_id
        seconds = train_model(draft, train_ids, config, stage="draft", steps=config.draft_steps,
                              lr=config.draft_lr, log=log)
    save_half(draft.float().cpu(), tokenizer, out)
    training = {
        "config": json.loads(json.dumps(asdict(config), default=str)),
        "vocab_size": len(tokenizer), "train_tokens": train_ids.numel(), "params": num_params(draft),
        "seconds": {"data": round(data_seconds, 1), "draft": round(seconds, 1)},
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
    }
    (out / "training.json").write_text(json.dumps(training, indent=2) + "\n")
    return training


if __name__ == "__main__":
    main()
