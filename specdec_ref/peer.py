"""Calling a peer library, and saying what it did (chapters 4 and 9, the audits).

The book sets this package beside `transformers`' own implementations (the *peer*):
its assisted generation, with one tokenizer or two. The peer is not ours to fix, and a
release can crash where the last one ran (5.25's cross-tokenizer greedy path feeds its
assistant zero tokens on some texts); a Colab learner gets whatever release Colab ships
that week. So a peer's crash is a finding, printed as one, never a failed cell or a
dead benchmark:

* `call_peer(called, fn, *args, **kwargs)` runs one call of the peer and returns a
  `PeerOutcome`: its value, or, when it raised, the error's first line, with what was
  called and the peer's version;
* `PeerOutcome.verdict(matched)` is what a chapter may state about that call: "ran
  and matched", "ran and differed" (named "matched" and "differed") or "crashed";
  `PeerOutcome.finding()` is the line it prints; `tally` counts verdicts for prose;
* `peer_sites` reads, from the installed `transformers`' source with `inspect`, the
  file and lines a chapter's statement about the peer's code rests on (chapter 9:
  `AssistantToTargetTranslator`), or says that they are not there.

Invariant: only the callable passed to `call_peer` is guarded; an error of this
package's own code still raises.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path
from typing import Any

import transformers

VERDICTS = ("matched", "differed", "crashed", "ran")


def first_line(error: BaseException | str) -> str:
    """`"<type>: <the message's first line>"` of an exception (a string: its first line).

    Args:
        error: the exception, or an error already written as text.

    Returns:
        One line, e.g. "RuntimeError: cannot reshape tensor of 0 elements ...".
    """
    if isinstance(error, BaseException):
        message = str(error).strip().splitlines()
        return f"{type(error).__name__}: {message[0]}" if message else type(error).__name__
    lines = str(error).strip().splitlines()
    return lines[0] if lines else ""


@dataclass(frozen=True)
class PeerOutcome:
    """What one call of the peer did: its value, or the first line of its error."""

    called: str  # what was called, as a reader would write it
    version: str  # the peer's version (transformers.__version__)
    value: Any = None  # the call's return value (None when it crashed)
    error: str | None = None  # "<type>: <first line>" when it raised, else None

    @property
    def crashed(self) -> bool:
        return self.error is not None

    def verdict(self, matched: bool | None = None) -> str:
        """ "crashed"; else "matched" or "differed" as `matched` says ("ran" when None)."""
        if self.crashed:
            return "crashed"
        if matched is None:
            return "ran"
        return "matched" if matched else "differed"

    def finding(self, width: int = 80) -> str:
        """The lines a chapter prints for this call, each at most `width` characters."""
        what = f"crashed: {self.error}" if self.crashed else "ran"
        text = f"transformers {self.version}: {self.called} {what}"
        return textwrap.fill(text, width, subsequent_indent="  ", break_on_hyphens=False)


def call_peer(called: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> PeerOutcome:
    """Call `fn(*args, **kwargs)`; an exception becomes the outcome, never propagates.

    Args:
        called: what is called, for the finding, e.g. "generate(assistant_model=...)".
        fn: the peer's callable (or a callable of ours around one).
        *args, **kwargs: its arguments.

    Returns:
        A `PeerOutcome` with the value, or with the error's first line; both carry
        the installed `transformers` version.
    """
    try:
        value = fn(*args, **kwargs)
    except Exception as error:  # the peer's crash is the finding
        return PeerOutcome(called, transformers.__version__, error=first_line(error))
    return PeerOutcome(called, transformers.__version__, value=value)


def crash_outcome(called: str, error: BaseException | str) -> PeerOutcome:
    """The outcome of a peer call that crashed inside a caller that caught it (an audit)."""
    return PeerOutcome(called, transformers.__version__, error=first_line(error))


def tally(verdicts: Sequence[str], noun: str = "cases") -> str:
    """Verdicts counted for prose: "matched in 4 of 4 cases", or
    "matched in 2, differed in 1 and crashed in 1 of 4 cases".

    Raises:
        ValueError: if `verdicts` is empty or holds a word outside `VERDICTS`.
    """
    unknown = sorted(set(verdicts) - set(VERDICTS))
    if not verdicts or unknown:
        raise ValueError(f"verdicts must be a non-empty list of {VERDICTS}, got {list(verdicts)!r}")
    counts = Counter(verdicts)
    parts = [f"{word} in {counts[word]}" for word in VERDICTS if counts[word]]
    joined = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"{joined} of {len(verdicts)} {noun}"


@dataclass(frozen=True)
class Site:
    """A place in the peer's source: a pattern to find inside a class or one of its methods."""

    name: str  # the key a chapter glues, e.g. "map"
    owner: str  # the class, in `module`
    method: str | None  # its method, or None for the class statement itself
    start: str  # a regular expression: the first line of the site
    end: str | None = None  # a regular expression: its last line (None: one line)


@dataclass(frozen=True)
class SourceSite:
    """Where a `Site` is in the installed source."""

    name: str
    file: str  # the path inside the transformers package, e.g. "generation/..."
    first: int  # line numbers in that file
    last: int
    text: str  # the first line, stripped

    @property
    def lines(self) -> str:
        """ "803" or "741-749"."""
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


CANDIDATES = "transformers.generation.candidate_generator"
TRANSLATOR = "AssistantToTargetTranslator"
# Chapter 9's statement about transformers' sampled path across tokenizers.
TRANSLATOR_SITES = (
    # the map target id -> draft id, filled in the order of the draft's get_vocab()
    Site("map", TRANSLATOR, "_get_assistant_to_target_input_ids", r"^\s*for .* in assistant_vocab\.items\(\):$"),
    # the draft's head pruned to the map's values, in that order
    Site("prune", TRANSLATOR, "__init__", r"self\.assistant_overlap_token_ids\s*=", r"set_output_embeddings"),
    # the pruned logits written at the target ids in ascending draft-id order
    Site("write", TRANSLATOR, "get_target_logits", r"assistant_indices_mask\s*=",
         r"target_logits\[.*\]\s*=\s*assistant_logits$"),
    # the user's draft model rewired in place: its output layer, then its input embedding
    Site("head", TRANSLATOR, "__init__", r"\.set_output_embeddings\("),
    Site("embeddings", TRANSLATOR, "__init__", r"\.set_input_embeddings\("),
    # translators cached per pair of tokenizers, whatever the draft model
    Site("cache", "AssistantVocabTranslatorCache", None, r"^\s*class AssistantVocabTranslatorCache"),
)


def peer_sites(sites: Sequence[Site] = TRANSLATOR_SITES,
               module: str = CANDIDATES) -> tuple[dict[str, SourceSite], list[str]]:
    """Find `sites` in the installed source of `module`.

    Args:
        sites: what to find.
        module: the module that holds their classes.

    Returns:
        (found, missing): the sites found by name, and a line for each one that is
        not there (a class, method or pattern absent from this release).
    """
    found: dict[str, SourceSite] = {}
    missing: list[str] = []
    try:
        namespace = import_module(module)
    except ImportError as error:
        return found, [f"{module}: {first_line(error)}"]
    root = Path(inspect.getfile(transformers)).parent
    for site in sites:
        where = f"{site.owner}.{site.method}" if site.method else site.owner
        owner = getattr(namespace, site.owner, None)
        target = getattr(owner, site.method, None) if site.method and owner is not None else owner
        if target is None:
            missing.append(f"{where}: not in {module}")
            continue
        lines, start = inspect.getsourcelines(target)
        file = Path(inspect.getsourcefile(target) or "")
        hits = [i for i, line in enumerate(lines) if re.search(site.start, line.rstrip())]
        if not hits:
            missing.append(f"{where}: no line matches {site.start!r}")
            continue
        first = hits[0]
        ends = [i for i, line in enumerate(lines) if i >= first and site.end and re.search(site.end, line.rstrip())]
        last = ends[0] if ends else first
        name = file.relative_to(root).as_posix() if file.is_relative_to(root) else file.name
        found[site.name] = SourceSite(site.name, name, start + first, start + last, lines[first].strip())
    return found, missing
