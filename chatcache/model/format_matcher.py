"""Decoding held to a reply format: which tokens may come next, one reply at a time.

`ReplyFormats` builds llguidance's twin of the model's tokenizer once and a `FormatMatcher`
per reply; `generation.next_token` and the scheduler mask the logits with what it allows.
What a format is lives in `chatcache/reply_format.py`, below the settings that hold one.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import llguidance

from ..errors import ConfigError
from ..reply_format import ReplyFormat

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


class FormatError(RuntimeError):
    """The decoder left a reply format (a defect: the mask allows only tokens that stay in it)."""


class FormatMatcher:
    """Where one reply stands in its format: which tokens may come next, and what came."""

    def __init__(self, tokenizer: llguidance.LLTokenizer, reply_format: ReplyFormat) -> None:
        self._matcher = llguidance.LLMatcher(tokenizer, reply_format.grammar())
        if self._matcher.is_error():
            raise ConfigError(f"The reply format ({reply_format.kind}) is not valid: {self._matcher.get_error()}")

    def allowed(self) -> bytes:
        """One byte per vocabulary entry: nonzero where that token may come next."""
        return self._matcher.compute_logit_bias()

    def accept(self, token: int) -> None:
        if not self._matcher.consume_token(token):
            raise FormatError(f"token {token} left the reply format: {self._matcher.get_error()}")


class ReplyFormats:
    """Builds `FormatMatcher`s on one tokenizer (its llguidance twin is built once, on first use:
    about a second)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_ids: set[int]) -> None:
        self._tokenizer = tokenizer
        self._eos_ids = sorted(eos_ids)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    def matcher(self, reply_format: ReplyFormat) -> FormatMatcher:
        import llguidance.hf  # imports transformers, which `GenerationConfig`'s users need not load
        from transformers import PreTrainedTokenizerFast

        with self._lock:
            if self._ll_tokenizer is None:
                if not isinstance(self._tokenizer, PreTrainedTokenizerFast):
                    raise ConfigError(
                        f"Reply formats need a fast (Rust) tokenizer; this model's is a {type(self._tokenizer).__name__}."
                    )
                self._ll_tokenizer = llguidance.hf.from_tokenizer(self._tokenizer, eos_token=self._eos_ids)
        return FormatMatcher(self._ll_tokenizer, reply_format)
