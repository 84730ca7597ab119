"""Two vocabularies: what each token spells, and the tokens both share (chapter 9).

A draft with a tokenizer of its own cannot hand its token ids to the target: id 17
is "▁the" to one and "ing" to the other. What the two have in common is text, so
everything here goes through the *bytes* a token spells:

* `token_spellings(tokenizer)`: for every id, its bytes. A byte-level BPE (GPT-2,
  Llama 3, Qwen) writes byte b as one printable character ("Ġ" is the space); a
  SentencePiece-style vocabulary (Llama 2, Mistral, Phi-3) writes a space as "▁"
  and a byte it has no piece for as "<0xE2>". Special tokens (EOS, BOS, ...) spell
  nothing: they are control symbols, matched by role, never by their text.
* `SharedVocabulary`: the ids of the two vocabularies that spell the same bytes,
  as two aligned index tensors; the sampled path drafts only from these.
* `TokenizerPair`: the text bridge both drafters use: the target's tokens as the
  draft's tokens (decode, then re-encode), and the draft's text as target tokens.

Invariant: text is encoded with special-token strings split like any other text, so
a draft that writes the characters "</s>" never becomes an EOS of the target; an end
of text passes from one model to the other only by role (`eos_token`).
"""

from __future__ import annotations

import json
import weakref
from dataclasses import dataclass
from functools import cache

import torch
from transformers import PreTrainedTokenizerBase

# How a SentencePiece-style tokenizer (the shipped draft's, the toy draft's) cuts text,
# spaces written "▁": runs of spaces before a word stay one piece, the last goes with the word.
PIECES = r"▁+(?=▁)|▁?[^▁\n]+|\n+|▁+"
# What a tokenizer must offer to take part (a "fast" tokenizer has them all).
NEEDED = ("convert_ids_to_tokens", "decode", "encode", "get_vocab", "backend_tokenizer")


def check_tokenizer(tokenizer: object, name: str) -> None:
    """A tokenizer the bridge can use: a fast one, with an end-of-text token.

    Raises:
        TypeError: naming `name` and the first missing method.
        ValueError: naming `name`, when it has no `eos_token`.
    """
    for method in NEEDED:
        if getattr(tokenizer, method, None) is None:
            raise TypeError(
                f"{name} must be a fast transformers tokenizer (with {', '.join(NEEDED)}); "
                f"{type(tokenizer).__name__} has no {method}")
    if tokenizer.eos_token_id is None:
        raise ValueError(f"{name} has no eos_token: the end of text could not pass between the two models")


@cache
def _byte_of_char() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: the character that stands for each byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:  # the other bytes are shifted past 255, in order
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _decoder_kinds(tokenizer: PreTrainedTokenizerBase) -> set[str]:
    """The types of the backend's decoder steps, e.g. {"ByteLevel"} or {"Replace", "ByteFallback"}."""
    decoder = json.loads(tokenizer.backend_tokenizer.to_str()).get("decoder") or {}
    steps = decoder.get("decoders", [decoder])
    return {step.get("type", "") for step in steps if step}


# What depends on one tokenizer or one pair alone, computed once per tokenizer object
# (a drafter is built many times over the same two): tokenizer -> (fingerprint, value).
_SPELLINGS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_SHARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _fingerprint(tokenizer: PreTrainedTokenizerBase) -> tuple:
    """What changes when a tokenizer is edited in place: its backend, size, special ids."""
    return id(tokenizer.backend_tokenizer), len(tokenizer), tuple(tokenizer.all_special_ids)


def token_spellings(tokenizer: PreTrainedTokenizerBase, name: str = "tokenizer") -> list[bytes | None]:
    """The bytes each id spells, indexed by id; None for special and unused ids.

    Computed once per tokenizer (a fresh list is returned each call).

    Raises:
        ValueError: naming `name`, for a decoder that is neither byte-level nor
            SentencePiece-style (its pieces' bytes cannot be read off).
    """
    return list(_known_spellings(tokenizer, name))


def id_count(tokenizer: PreTrainedTokenizerBase, name: str = "tokenizer") -> int:
    """How many ids `tokenizer` has: its largest id + 1, added tokens included."""
    return len(_known_spellings(tokenizer, name))


def _known_spellings(tokenizer: PreTrainedTokenizerBase, name: str) -> tuple[bytes | None, ...]:
    """`token_spellings`, read once per tokenizer (again if it was edited)."""
    check_tokenizer(tokenizer, name)
    fingerprint = _fingerprint(tokenizer)
    known = _SPELLINGS.get(tokenizer)
    if known is None or known[0] != fingerprint:
        known = (fingerprint, tuple(_read_spellings(tokenizer, name)))
        _SPELLINGS[tokenizer] = known
    return known[1]


def _read_spellings(tokenizer: PreTrainedTokenizerBase, name: str) -> list[bytes | None]:
    """`token_spellings`, computed."""
    kinds = _decoder_kinds(tokenizer)
    byte_level = "ByteLevel" in kinds
    if not byte_level and not kinds & {"Replace", "Metaspace", "ByteFallback"}:
        raise ValueError(f"{name}'s decoder ({sorted(kinds) or 'none'}) is neither byte-level nor "
                         "SentencePiece-style: cannot read the bytes of its tokens")
    special = set(tokenizer.all_special_ids) | {
        i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    size = max(tokenizer.get_vocab().values()) + 1
    spellings: list[bytes | None] = [None] * size
    byte_of = _byte_of_char()
    for piece, i in tokenizer.get_vocab().items():
        if i in special:
            continue
        if byte_level:
            if all(c in byte_of for c in piece):
                spellings[i] = bytes(byte_of[c] for c in piece)
        elif _is_byte_token(piece):
            spellings[i] = bytes([int(piece[3:5], 16)])  # a byte-fallback token
        else:
            spellings[i] = piece.replace("▁", " ").encode()
    return spellings


@dataclass(frozen=True)
class SharedVocabulary:
    """The tokens both vocabularies have, as aligned ids: draft_ids[j] spells what target_ids[j] spells."""

    draft_ids: torch.Tensor  # (S,) ids in the draft's vocabulary
    target_ids: torch.Tensor  # (S,) the same tokens' ids in the target's vocabulary
    target_size: int  # ids the target's tokenizer has (the share's denominator)

    @property
    def share_of_target(self) -> float:
        """The fraction of the target's ids the draft can propose."""
        return self.target_ids.numel() / self.target_size


def shared_vocabulary(target_tokenizer: PreTrainedTokenizerBase,
                      draft_tokenizer: PreTrainedTokenizerBase) -> SharedVocabulary:
    """Match the two vocabularies by the bytes each token spells (the token-level
    intersection of Timor et al., 2025), one id per spelling on each side.

    Where several ids of one tokenizer spell the same bytes (a byte-fallback
    "<0x21>" beside "!"), the one kept is the id that tokenizer writes for them
    (`canonical_ids`). Computed once per pair of tokenizers.

    Raises:
        ValueError: naming `draft_tokenizer`, when no token spells the same bytes in both.
    """
    target = token_spellings(target_tokenizer, "target_tokenizer")
    draft = token_spellings(draft_tokenizer, "draft_tokenizer")
    fingerprint = (_fingerprint(target_tokenizer), _fingerprint(draft_tokenizer))
    by_draft = _SHARED.setdefault(target_tokenizer, weakref.WeakKeyDictionary())
    known = by_draft.get(draft_tokenizer)
    if known is not None and known[0] == fingerprint:
        return known[1]
    target_id = canonical_ids(target_tokenizer, target)
    draft_id = canonical_ids(draft_tokenizer, draft)
    pairs = sorted((draft_id[s], t) for s, t in target_id.items() if s in draft_id)
    if not pairs:
        raise ValueError("draft_tokenizer shares no token with target_tokenizer (no two tokens spell the same "
                         "bytes): the sampled path has nothing to draft; use the text path (TextDrafter)")
    draft_ids, target_ids = zip(*pairs, strict=True)
    shared = SharedVocabulary(torch.tensor(draft_ids), torch.tensor(target_ids), len(target))
    by_draft[draft_tokenizer] = (fingerprint, shared)
    return shared


def canonical_ids(tokenizer: PreTrainedTokenizerBase, spellings: list[bytes | None]) -> dict[bytes, int]:
    """One id per spelling: where several ids spell the same bytes, the one
    `tokenizer` writes for that text, else the first that is not a byte-fallback
    token, else the lowest."""
    groups: dict[bytes, list[int]] = {}
    for i, spelling in enumerate(spellings):
        if spelling is not None:
            groups.setdefault(spelling, []).append(i)
    chosen = {}
    for spelling, ids in groups.items():
        if len(ids) > 1:
            written = encode_text(tokenizer, spelling.decode(errors="replace"))
            pieces = tokenizer.convert_ids_to_tokens(ids)
            plain = [i for i, piece in zip(ids, pieces, strict=True) if not _is_byte_token(piece)]
            ids = [written[0]] if len(written) == 1 and written[0] in ids else plain or ids
        chosen[spelling] = ids[0]
    return chosen


def _is_byte_token(piece: str) -> bool:
    """Whether a piece is a byte-fallback token such as "<0xE2>"."""
    return len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")


def encode_text(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
    """`text` as plain text: no BOS added, and "</s>" written out spelled, not as a special token."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


class TokenizerPair:
    """The text bridge between a target's and a draft's tokenizer.

    `draft_view(target_ids)` is the target's sequence as the draft reads it;
    `target_tokens(text, target_ids)` is new text as target tokens that continue
    `target_ids`. Special tokens cross by role: the target's EOS / BOS become the
    draft's, and back.
    """

    def __init__(self, target_tokenizer: PreTrainedTokenizerBase,
                 draft_tokenizer: PreTrainedTokenizerBase, lookbehind: int = 4) -> None:
        check_tokenizer(target_tokenizer, "target_tokenizer")
        check_tokenizer(draft_tokenizer, "draft_tokenizer")
        self.target, self.draft, self.lookbehind = target_tokenizer, draft_tokenizer, lookbehind
        # Role by role: the target's special id -> the draft's (None where the draft has no such role).
        self.to_draft_special = {}
        # One id in several roles (GPT-2: <|endoftext|> is BOS, EOS and padding) crosses as an EOS.
        for role in ("eos_token_id", "bos_token_id", "pad_token_id", "unk_token_id"):
            tid = getattr(target_tokenizer, role)
            if tid is not None and tid not in self.to_draft_special:
                self.to_draft_special[tid] = getattr(draft_tokenizer, role)
        self.target_eos, self.draft_eos = target_tokenizer.eos_token_id, draft_tokenizer.eos_token_id
        self.target_special = set(target_tokenizer.all_special_ids)
        self.draft_special = set(draft_tokenizer.all_special_ids)

    def draft_view(self, target_ids: list[int]) -> list[int]:
        """The target's sequence in the draft's tokens: text re-encoded, special tokens by role."""
        out: list[int] = []
        start = 0
        for i, token in enumerate([*target_ids, None]):
            if token is None or token in self.target_special:
                text = self.target.decode(target_ids[start:i])
                out += encode_text(self.draft, text) if text else []
                mapped = self.to_draft_special.get(token) if token is not None else None
                out += [mapped] if mapped is not None else []
                start = i + 1
        return out

    def draft_text(self, draft_ids: list[int], view: list[int]) -> tuple[str, bool]:
        """The text of new draft tokens written after `view`, cut at the draft's
        EOS; and whether it reached one.

        The text is the difference of two decodes, of the last `lookbehind` tokens
        of `view` with and without the new ones: a SentencePiece decoder that strips
        the first space of what it decodes (Llama 2, Mistral) would otherwise drop
        the space the first new token begins with.
        """
        ended = self.draft_eos in draft_ids
        new = draft_ids[:draft_ids.index(self.draft_eos)] if ended else draft_ids
        context = self._tail(view, self.draft_special)
        if context:
            before = self.draft.decode(context, skip_special_tokens=True)
            after = self.draft.decode(context + new, skip_special_tokens=True)
            if after.startswith(before):
                return after[len(before):], ended
        # After a special token, or where the context decodes differently once
        # continued (a character split across it), the new tokens start the text.
        return self.draft.decode(new, skip_special_tokens=True), ended

    def _tail(self, ids: list[int], special: set[int]) -> list[int]:
        """The last `lookbehind` ids, after the last special token among them."""
        tail = ids[-self.lookbehind:]
        specials = [i for i, t in enumerate(tail) if t in special]
        return tail[specials[-1] + 1:] if specials else tail

    def target_tokens(self, text: str, target_ids: list[int]) -> list[int]:
        """`text` as target tokens after `target_ids`, the sequence so far.

        The last `lookbehind` tokens' text is encoded with and without the new
        text, and the new tokens are what the first adds, so that a word split
        across the boundary is tokenized as the target would, and a tokenizer
        that prepends "▁" to what it encodes (Llama 2) adds it to the context,
        not to the new text; if the new text would rewrite a token already
        emitted, it is encoded on its own.
        """
        if not text:
            return []
        tail = self._tail(target_ids, self.target_special)  # text after the last special token
        if tail:
            context = self.target.decode(tail)
            before = encode_text(self.target, context)  # the tail, or how it re-encodes
            ids = encode_text(self.target, context + text)
            if ids[:len(before)] == before:
                return ids[len(before):]
        return encode_text(self.target, text)
