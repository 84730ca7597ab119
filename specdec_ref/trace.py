"""What a speculative generation did, token by token, as text a reader can follow.

`speculative_generate` records every iteration (`decoder.IterationRecord`): the K
tokens the draft proposed, how many the target accepted, and what it emitted. This
module turns that record into text, for the demo (`python -m specdec_ref`) and the
book's opening page:

* `marked_text`: the continuation with every token's origin marked, a draft the
  target accepted (plain), drafts it threw away (`~...~`), the target's correction
  after a rejection (`[...]`), the bonus token after a fully accepted block
  (`{...}`) and the token of a plain target step, where the drafter proposed nothing
  (`<...>`: prompt lookup with no match); `legend` says so;
* `iteration_lines`: per iteration, what was drafted and what was kept, the way the
  source article prints its "Drafted / Accepted" lines;
* `stats_lines`: the run's counters, each ratio under its own name (notation page):
  block efficiency = tokens per target pass; alpha, the chance one draft is
  accepted, estimated by accepted / judged drafts; the acceptance rate, accepted /
  drafted, which is lower than alpha when K > 1.

Invariant: removing the markers and the discarded drafts from `marked_text` (with
lines wide enough not to be folded) gives back the decoded continuation
(`tests/test_pages.py`). Nothing here changes a generation.
"""

from __future__ import annotations

from collections.abc import Sequence

from .decoder import GenerationStats, IterationRecord

# How `marked_text` marks each token's origin (one line each, 80 characters at most).
LEGEND = (
    "plain: a draft token the target accepted\n"
    "~...~: drafts the target threw away (from the first one it rejected on)\n"
    "[...]: the target's correction, sampled where it rejected a draft\n"
    "{...}: the bonus token, from the target, after all K drafts were accepted\n"
    "\N{DOWNWARDS ARROW WITH CORNER LEFTWARDS}: a newline inside a marked token"
)
NEWLINE_MARK = "\N{DOWNWARDS ARROW WITH CORNER LEFTWARDS}"
# The line `legend` adds for a trace with an iteration that drafted nothing.
STEP_LEGEND = "<...>: a plain target step, where the drafter proposed nothing"


def decode(tokens: Sequence[int], tokenizer: object | None = None) -> str:
    """The text of `tokens`, or their ids separated by spaces when there is no tokenizer."""
    if tokenizer is None:
        return "".join(f" {t}" for t in tokens)
    return tokenizer.decode(list(tokens))


def show_tokens(tokens: Sequence[int], tokenizer: object | None = None) -> str:
    """Each token on its own: quoted pieces of text (`' a' ' topic'`), or ids."""
    if tokenizer is None:
        return " ".join(str(t) for t in tokens)
    return " ".join(repr(tokenizer.decode([t])) for t in tokens)


def split_record(record: IterationRecord) -> tuple[list[int], list[int], list[int], str]:
    """(accepted drafts, discarded drafts, added token, kind) of one iteration.

    The added token is the target's own: the correction at the first rejected slot
    (kind "correction"), the bonus when every one of K >= 1 drafts was accepted
    ("bonus"), or, when the drafter proposed nothing (K = 0), the token of one plain
    target step ("target step": no draft was judged, so it is no bonus). After an EOS
    the record's `emitted` is cut, so the added token (and even some accepted drafts)
    may be missing.
    """
    k, accepted = len(record.drafted), record.num_accepted
    kept = record.emitted[:accepted]
    added = record.emitted[accepted:accepted + 1]
    discarded = record.drafted[accepted:] if accepted < k and added else []
    kind = "target step" if k == 0 else "bonus" if accepted == k else "correction"
    return kept, discarded, added, kind


def legend(trace: Sequence[IterationRecord]) -> str:
    """`LEGEND`, with the line for `<...>` when an iteration of `trace` drafted nothing."""
    if all(record.drafted for record in trace):
        return LEGEND
    *markers, newline = LEGEND.splitlines()
    return "\n".join([*markers, STEP_LEGEND, newline])


MARKERS = {"bonus": "{}", "correction": "[]", "target step": "<>"}


def _marked(text: str, opening: str, closing: str) -> str:
    """`text` between markers; a newline inside shows as an arrow, then breaks the line."""
    return opening + text.replace("\n", NEWLINE_MARK + "\n") + closing


def marked_text(trace: Sequence[IterationRecord], tokenizer: object | None = None, *, width: int = 80) -> str:
    """The continuation a trace emitted, with each token's origin marked (see `LEGEND`).

    Args:
        trace: `GenerationOutput.trace` of one `speculative_generate` call.
        tokenizer: decodes the tokens; None shows ids.
        width: lines longer than this are broken (a reader's page does not scroll).

    Returns:
        The marked text, every line at most `width` characters.
    """
    if width < 1:
        raise ValueError(f"width must be >= 1, got {width}")
    parts = []
    for record in trace:
        kept, discarded, added, kind = split_record(record)
        parts.append(decode(kept, tokenizer))
        if discarded:
            parts.append(_marked(decode(discarded, tokenizer), "~", "~"))
        if added:
            parts.append(_marked(decode(added, tokenizer), *MARKERS[kind]))
    return "\n".join(piece for line in "".join(parts).split("\n") for piece in _fold(line, width))


def _fold(line: str, width: int) -> list[str]:
    """`line` in pieces of at most `width` characters, cut before a space where there is one."""
    pieces = []
    while len(line) > width:
        cut = line.rfind(" ", width // 2, width + 1)
        cut = cut if cut > 0 else width
        pieces.append(line[:cut])
        line = line[cut:]
    return [*pieces, line]


def iteration_lines(trace: Sequence[IterationRecord], tokenizer: object | None = None,
                    *, width: int = 80) -> list[str]:
    """Two lines per iteration: the K drafted tokens, then how many were kept and what was added.

    Example::

          1. drafted ' a' ' topic' ' that' ' has'
             accepted 2/4, then correction: ' is'
          2. drafted nothing
             a plain target step: ' a'

    Lines longer than `width` continue on the next line, indented.
    """
    lines = []
    for number, record in enumerate(trace, start=1):
        kept, _, added, kind = split_record(record)
        k = len(record.drafted)
        if k == 0:  # the drafter proposed nothing: one ordinary step of the target
            lines += _wrap(f"{number:3d}. drafted nothing", width)
            lines += _wrap(f"     a plain target step: {show_tokens(added, tokenizer)}", width)
            continue
        lines += _wrap(f"{number:3d}. drafted {show_tokens(record.drafted, tokenizer)}", width)
        then = f", then {kind}: {show_tokens(added, tokenizer)}" if added else ", then EOS"
        lines += _wrap(f"     accepted {record.num_accepted}/{k}{then}", width)
    return lines


def _wrap(line: str, width: int, indent: str = " " * 9) -> list[str]:
    """`line` cut into pieces of at most `width` characters, continuations indented."""
    pieces, rest = [line[:width]], line[width:]
    while rest:
        pieces.append(indent + rest[: width - len(indent)])
        rest = rest[width - len(indent):]
    return pieces


def stats_lines(stats: GenerationStats) -> list[str]:
    """The counters of one run, each ratio named as on the notation page (short lines)."""
    return [
        f"new tokens {stats.new_tokens} in {stats.iterations} iterations: "
        f"{stats.target_calls} target passes, {stats.draft_calls} draft passes",
        f"block efficiency: {stats.tokens_per_target_call:.2f} tokens per target pass",
        f"alpha, estimated: {stats.per_token_acceptance:.2f} "
        f"(accepted {stats.accepted_tokens} / judged {stats.judged_tokens} drafts)",
        f"acceptance rate: {stats.acceptance_rate:.2f} "
        f"(accepted {stats.accepted_tokens} / drafted {stats.drafted_tokens} drafts)",
    ]
