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


def token_spellings(tokenizer: PreTrainedTokenizerBase, name: str = "tokenizer") -> list[bytes | None]:
    """The bytes each id spells, indexed by id; None for special and unused ids.

    Raises:
        ValueError: naming `name`, for a decoder that is neither byte-level nor
            SentencePiece-style (its pieces' bytes cannot be read off).
    """
    check_tokenizer(tokenizer, name)
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
        elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
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
    intersection of Timor et al., 2025).

    Raises:
        ValueError: naming `draft_tokenizer`, when no token spells the same bytes in both.
    """
    target = token_spellings(target_tokenizer, "target_tokenizer")
    draft = token_spellings(draft_tokenizer, "draft_tokenizer")
    target_id = {spelling: i for i, spelling in enumerate(target) if spelling is not None}
    pairs = [(i, target_id[s]) for i, s in enumerate(draft) if s is not None and s in target_id]
    if not pairs:
        raise ValueError("draft_tokenizer shares no token with target_tokenizer (no two tokens spell the same "
                         "bytes): the sampled path has nothing to draft; use the text path (TextDrafter)")
    draft_ids, target_ids = zip(*pairs, strict=True)
    return SharedVocabulary(torch.tensor(draft_ids), torch.tensor(target_ids), len(target))


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

    @staticmethod
    def _encode(tokenizer: PreTrainedTokenizerBase, text: str) -> list[int]:
        """`text` as plain text: no BOS added, and "</s>" written out spelled, not as a special token."""
        return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]

    def draft_view(self, target_ids: list[int]) -> list[int]:
        """The target's sequence in the draft's tokens: text re-encoded, special tokens by role."""
        out: list[int] = []
        start = 0
        for i, token in enumerate([*target_ids, None]):
            if token is None or token in self.target_special:
                text = self.target.decode(target_ids[start:i])
                out += self._encode(self.draft, text) if text else []
                mapped = self.to_draft_special.get(token) if token is not None else None
                out += [mapped] if mapped is not None else []
                start = i + 1
        return out

    def draft_text(self, draft_ids: list[int]) -> tuple[str, bool]:
        """The text of new draft tokens, cut at the draft's EOS; and whether it reached one."""
        for i, token in enumerate(draft_ids):
            if token == self.draft_eos:
                return self.draft.decode(draft_ids[:i], skip_special_tokens=True), True
        return self.draft.decode(draft_ids, skip_special_tokens=True), False

    def target_tokens(self, text: str, target_ids: list[int]) -> list[int]:
        """`text` as target tokens after `target_ids`, the sequence so far.

        The last `lookbehind` tokens are re-encoded with the text, so that a word
        split across the boundary is tokenized as the target would; if that would
        rewrite a token already emitted, the text is encoded on its own.
        """
        if not text:
            return []
        tail = target_ids[-self.lookbehind:]
        specials = [i for i, t in enumerate(tail) if t in self.target_special]
        tail = tail[specials[-1] + 1:] if specials else tail  # text after the last special token
        if tail:
            ids = self._encode(self.target, self.target.decode(tail) + text)
            if ids[:len(tail)] == tail:
                return ids[len(tail):]
        return self._encode(self.target, text)
