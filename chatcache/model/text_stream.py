"""Turn generated token ids into text pieces, honouring stop sequences.

Decoding token by token breaks multi-byte characters and merges spaces wrongly, so the whole
reply is decoded each step and only the new suffix is emitted. Text that might be the start
of a stop sequence is held back until it is known not to be one.
"""

from __future__ import annotations

import re

from transformers import PreTrainedTokenizerBase


class TextStream:
    """Accumulates reply ids and hands out the text that is safe to show."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop: tuple[str, ...]) -> None:
        self._tokenizer = tokenizer
        self._stop = stop
        self._holdback = max((len(s) for s in stop), default=1) - 1
        self._ids: list[int] = []
        self.text = ""
        self._emitted = 0
        self.stopped = False

    def add(self, token_id: int) -> str:
        """Add a token; return the text that became safe to show (may be empty)."""
        self._ids.append(token_id)
        text = str(self._tokenizer.decode(self._ids, skip_special_tokens=True))
        if text.endswith("\ufffd"):
            return ""  # an incomplete multi-byte character: wait for the next token
        # A NUL is no text to show, and the session tier refuses it on every backend (PostgreSQL
        # cannot store it): like a byte that is not UTF-8, it shows as U+FFFD.
        text = text.replace("\x00", "\ufffd")
        self.text = text
        for stop in self._stop:
            index = text.find(stop)
            if index != -1:
                self.text = text[:index]
                self.stopped = True
                return self.flush()
        safe_end = max(self._emitted, len(text) - self._holdback)
        piece, self._emitted = text[self._emitted:safe_end], safe_end
        return piece

    def flush(self) -> str:
        """Everything not yet shown (at the end of the reply)."""
        piece, self._emitted = self.text[self._emitted:], len(self.text)
        return piece


def token_pieces(tokenizer: PreTrainedTokenizerBase, text: str) -> list[str]:
    """A whole text as the model would have streamed it (a cached answer replayed as if
    generated): a piece per token, cut at the tokens' character offsets, so the pieces join back
    to `text` exactly (a character several tokens share stays whole). A tokenizer that gives no
    offsets (a slow, Python one) replays word by word, each word with the whitespace before it."""
    if not text:
        return [text]
    try:
        offsets = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    except NotImplementedError:
        return re.findall(r"\s*\S+|\s+$", text)
    cuts = [0, *sorted({end for _, end in offsets if 0 < end < len(text)}), len(text)]
    return [text[start:end] for start, end in zip(cuts, cuts[1:])]
