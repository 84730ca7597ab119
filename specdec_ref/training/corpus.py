"""A training corpus that needs no download: the text of the Python installation itself.

The tiny model pair (`specdec_ref/pairs/tiny`) is trained on two sources every Python
installation carries:

* the documentation topics that ship with CPython (`pydoc_data.topics`, the text `help()`
  prints: English prose about the language), and
* the source files of the standard library (code, comments and docstrings), leaving out
  the test suites, the codec tables and the vendored packages.

Invariant: the train / held-out split is a pure function of each document's name (a
SHA-256 of "topics/<key>" or of the path relative to the standard library), so it is the
same on every machine, whatever the order in which files are found, and a document held
out under one Python version stays held out under another. Nothing of this corpus is
committed to the repository; it is rebuilt from the running interpreter.
"""

from __future__ import annotations

import hashlib
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

# Folders of the standard library that are not the library itself: test suites, the
# codec lookup tables (long runs of hex numbers), vendored wheels, the duplicate of the
# pydoc topics, and byte-code caches.
EXCLUDED_PARTS = frozenset({
    "site-packages", "dist-packages", "test", "tests", "idle_test", "encodings", "pydoc_data",
    "__pycache__", "_bundled", "lib-dynload",
})


@dataclass(frozen=True)
class CorpusConfig:
    """Which text goes into the corpus and how it is split."""

    held_out_fraction: float = 0.05  # share of documents kept out of training
    include_topics: bool = True  # the pydoc documentation topics (prose)
    include_source: bool = True  # the standard library's .py files (code and docstrings)
    max_file_bytes: int = 300_000  # skip larger source files (generated tables)
    max_documents: int | None = None  # keep only the first N documents (by name): quick runs
    split_salt: str = "specdec-tiny-v1"  # changes the split without changing the text

    def __post_init__(self) -> None:
        if not 0.0 < self.held_out_fraction < 1.0:
            raise ValueError(f"held_out_fraction must be in (0, 1), got {self.held_out_fraction!r}")
        if not (self.include_topics or self.include_source):
            raise ValueError("include_topics and include_source are both False: the corpus would be empty")
        if self.max_documents is not None and self.max_documents < 2:
            raise ValueError(f"max_documents must be None or >= 2, got {self.max_documents!r}")


@dataclass(frozen=True)
class Document:
    """One unit of the corpus: a documentation topic or a source file."""

    name: str  # "topics/<key>" or the path relative to the standard library, e.g. "json/decoder.py"
    text: str


@dataclass
class Corpus:
    """The documents on each side of the split, sorted by name."""

    train: list[Document] = field(default_factory=list)
    held_out: list[Document] = field(default_factory=list)

    def num_chars(self) -> dict[str, int]:
        """Characters on each side of the split."""
        return {"train": sum(len(d.text) for d in self.train), "held_out": sum(len(d.text) for d in self.held_out)}


def stdlib_dir() -> Path:
    """The folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _topic_documents() -> Iterator[tuple[str, Callable[[], str]]]:
    """The documentation topics `help()` shows: (name, text reader) per topic."""
    from pydoc_data.topics import topics  # ships with CPython; imported lazily (about 0.5 MB)

    for key in sorted(topics):
        yield f"topics/{key}", lambda key=key: topics[key]


def _read_source(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        return ""


def _source_documents(max_file_bytes: int) -> Iterator[tuple[str, Callable[[], str]]]:
    """The standard library's own .py files, sorted by relative path: (name, text reader)."""
    root = stdlib_dir()
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if EXCLUDED_PARTS.intersection(relative.parts[:-1]) or relative.name.startswith("_sysconfigdata"):
            continue
        if relative.parts[0].startswith("config-") or path.stat().st_size > max_file_bytes:
            continue
        yield relative.as_posix(), lambda path=path: _read_source(path)


def is_held_out(name: str, config: CorpusConfig = CorpusConfig()) -> bool:
    """Whether the document called `name` belongs to the held-out side of the split."""
    digest = hashlib.sha256(f"{config.split_salt}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < config.held_out_fraction


def iter_documents(config: CorpusConfig = CorpusConfig(), side: str | None = None) -> Iterator[Document]:
    """The documents of the corpus (topics first, then source files), in a fixed order.

    Args:
        config: what the corpus holds.
        side: "train" or "held_out" for one side of the split (only those files are
            read), None for every document.
    """
    if side not in (None, "train", "held_out"):
        raise ValueError(f"side must be None, 'train' or 'held_out', got {side!r}")
    sources = []
    if config.include_topics:
        sources.append(_topic_documents())
    if config.include_source:
        sources.append(_source_documents(config.max_file_bytes))
    count = 0
    for source in sources:
        for name, read in source:
            if config.max_documents is not None and count >= config.max_documents:
                return
            count += 1
            if side is not None and is_held_out(name, config) != (side == "held_out"):
                continue
            text = read()
            if text.strip():
                yield Document(name, text)


def load_corpus(config: CorpusConfig = CorpusConfig()) -> Corpus:
    """Read the corpus from the Python installation and split it by document name.

    Raises:
        ValueError: if either side of the split ends up empty.
    """
    corpus = Corpus()
    for document in iter_documents(config):
        (corpus.held_out if is_held_out(document.name, config) else corpus.train).append(document)
    if not corpus.train or not corpus.held_out:
        raise ValueError(
            f"the split left {len(corpus.train)} train and {len(corpus.held_out)} held-out documents: "
            "raise max_documents or change held_out_fraction"
        )
    return corpus


def held_out_prompts(
    tokenizer,
    *,
    num_prompts: int = 16,
    prompt_tokens: int = 32,
    seed: int = 0,
    config: CorpusConfig = CorpusConfig(),
) -> list[torch.Tensor]:
    """Prompts cut from held-out documents the models never saw in training.

    Each prompt is `prompt_tokens` consecutive tokens of one held-out document, starting
    at the beginning of a line. Documents and offsets are drawn with a seeded generator,
    so the same seed, tokenizer and Python installation give the same prompts.

    Args:
        tokenizer: a `transformers` tokenizer (the pair's).
        num_prompts: how many prompts (>= 1).
        prompt_tokens: tokens per prompt (>= 1).
        seed: seeds the choice of documents and offsets.
        config: the corpus configuration whose held-out side is used.

    Returns:
        `num_prompts` tensors of token ids, each of shape (1, prompt_tokens).
    """
    # Only the held-out documents are read in full; long enough ones can host a prompt.
    texts = [document.text for document in iter_documents(config, side="held_out")]
    return _cut_prompts(texts, tokenizer, num_prompts, prompt_tokens, seed, "held-out")


def outside_prompts(tokenizer, *, num_prompts: int = 16, prompt_tokens: int = 32,
                    seed: int = 0) -> list[torch.Tensor]:
    """Prompts from outside the training domain: CPython's own test suite (`test/test_*.py`),
    which the corpus leaves out (`EXCLUDED_PARTS`): code of another genre (assertions,
    fixtures, unusual inputs) than the library and documentation the models learned.
    Cut as `held_out_prompts` cuts them, so the same seed gives the same prompts."""
    paths = sorted((stdlib_dir() / "test").glob("test_*.py"))
    texts = [_read_source(path) for path in paths]
    return _cut_prompts(texts, tokenizer, num_prompts, prompt_tokens, seed, "test-suite")


def _cut_prompts(texts: list[str], tokenizer, num_prompts: int, prompt_tokens: int, seed: int,
                 kind: str) -> list[torch.Tensor]:
    """`num_prompts` runs of `prompt_tokens` tokens, each from a line start of a seeded document."""
    if num_prompts < 1:
        raise ValueError(f"num_prompts must be >= 1, got {num_prompts!r}")
    if prompt_tokens < 1:
        raise ValueError(f"prompt_tokens must be >= 1, got {prompt_tokens!r}")
    documents = texts
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(documents), generator=generator).tolist()
    prompts: list[torch.Tensor] = []
    for index in order * ((num_prompts // max(len(order), 1)) + 1):
        if len(prompts) == num_prompts:
            break
        text = documents[index]
        # Start at a line boundary somewhere in the document.
        starts = [0] + [i + 1 for i, c in enumerate(text) if c == "\n" and i + 1 < len(text)]
        start = starts[int(torch.randint(len(starts), (1,), generator=generator))]
        ids = tokenizer(text[start : start + 16 * prompt_tokens], add_special_tokens=False)["input_ids"]
        if len(ids) >= prompt_tokens:
            prompts.append(torch.tensor([ids[:prompt_tokens]], dtype=torch.long))  # (1, prompt_tokens)
    if len(prompts) < num_prompts:
        raise ValueError(f"only {len(prompts)} {kind} prompts of {prompt_tokens} tokens found; ask for fewer")
    return prompts
