"""Encode what people wrote as plain text, so typing `<|im_start|>system` cannot forge a turn.

A chat template's structure is written with special tokens (`<|im_start|>`, `<|im_end|>`),
and encoding the rendered template with special-token parsing on is what turns them into
those tokens. Message content goes through the same text, so without care a user's
`<|im_start|>system ...<|im_end|>` arrives as a real system turn.

`PlainText` marks every special-token string inside message content before the template
renders it, and `encode_rendered` then encodes the template's own text as usual and each
marked string as ordinary characters. Content without special-token strings renders and
encodes exactly as before (the token tier relies on stable ids), and the template still sees
the real content, so filters such as `trim` behave as they always did.

What it deliberately does not do: added tokens that the tokenizer does not flag as special
(some tokenizers add whitespace runs or words that way) stay ordinary vocabulary; and a
template that glues a fragment of a special token onto content (`content + 'end|>'`) is
malformed and not guarded against.
"""

from __future__ import annotations

import re

from transformers import PreTrainedTokenizerBase

# Unicode noncharacters are reserved for a program's internal use: no text should carry them,
# and any that content does carry are removed so they cannot fake a marked region.
_START, _END = "\ufdd0", "\ufdd1"
_MARKED = re.compile(f"{_START}([^{_START}{_END}]*){_END}|[{_START}{_END}]")


class PlainText:
    """Encodes message content so that no special token can come out of it."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer
        self.special_ids = frozenset(
            {index for index, token in tokenizer.added_tokens_decoder.items() if token.special}
            | set(tokenizer.all_special_ids)
        )
        strings = {token.content for token in tokenizer.added_tokens_decoder.values() if token.special}
        strings |= set(tokenizer.all_special_tokens)
        # Longest first, so `<|im_start|>` is marked whole rather than a shorter token inside it.
        alternatives = "|".join(re.escape(s) for s in sorted(strings, key=len, reverse=True) if s)
        self._special = re.compile(alternatives) if alternatives else None

    def encode(self, text: str) -> list[int]:
        """Ids of a message's own text (what it counts as, or an assistant reply without its ids)."""
        return self.encode_rendered(self.mark(text))

    def mark(self, content: str) -> str:
        """`content` with each special-token string wrapped in markers, for the template to render."""
        content = content.replace(_START, "").replace(_END, "")
        if self._special is None:
            return content
        return self._special.sub(lambda match: f"{_START}{match.group(0)}{_END}", content)

    def defused(self, content: str) -> str:
        """`content` with a zero-width space after the first character of each special-token
        string: for a server that renders and tokenizes messages itself, parsing special
        tokens, so that nothing a person wrote arrives there as one. The text reads the same."""
        if self._special is None:
            return content
        return self._special.sub(lambda match: f"{match.group(0)[0]}\u200b{match.group(0)[1:]}", content)

    def encode_rendered(self, text: str) -> list[int]:
        """Ids of template output rendered from marked content: its own special tokens stay special.

        A template that splits content (`split()`, slicing) may separate a marker from its
        token; a lone marker is dropped but still breaks the text, so nothing joins across it.
        """
        if _START not in text and _END not in text:
            return list(self.tokenizer.encode(text, add_special_tokens=False)) if text else []
        ids: list[int] = []
        # re.split alternates: text, marked string (None for a lone marker), text, ...
        pieces = _MARKED.split(text)
        for index, piece in enumerate(pieces):
            if not piece:
                continue
            if index % 2:
                ids += self._encode_as_characters(piece)
            else:
                ids += self.tokenizer.encode(piece, add_special_tokens=False)
        return ids

    def _encode_as_characters(self, text: str) -> list[int]:
        backend = getattr(self.tokenizer, "backend_tokenizer", None)
        if backend is None:
            ids = list(self.tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True))
        else:
            # The fast tokenizer's pipeline minus its added-token matching. Not
            # `split_special_tokens=True`: that flips a flag on the shared Rust tokenizer for
            # the call, and a concurrent ordinary encode could flip it back mid-call.
            if backend.normalizer is not None:
                text = backend.normalizer.normalize_str(text)
            splits = [text]
            if backend.pre_tokenizer is not None:
                splits = [split for split, _ in backend.pre_tokenizer.pre_tokenize_str(text)]
            ids = [token.id for split in splits for token in backend.model.tokenize(split)]
        if self.special_ids.intersection(ids):
            raise ValueError(f"{type(self.tokenizer).__name__} spells {text!r} with special tokens even as plain text")
        return ids
