"""Run the chat model on a prompt: streamed on a session's cached KV, or once on a throwaway cache.

`stream` is a turn's only path to the model. It checks the session's KV out of the token
tier (cropped to what the prompt shares with it), hands the rest of the prompt to the
scheduler (which batches the decodes of every running turn), streams the reply, and checks
the KV back in covering everything the model has seen. A reply may be drafted from cached
answers the turn passes and from its own prompt (prompt lookup, `model.drafts`) when the
scheduler drafts (`Scheduler.draft_tokens`, off by default): it checks the drafted tokens in the
forward pass it runs anyway and keeps those the model would have written (or, sampling, as
likely as it would have). `complete` answers a prompt off the record, for answer-cache audits
and prefetching, through the same scheduler; `decode_batches` runs a warm-up's batches on it,
so its step costs are measured before the first turn. A model whose cache cannot be batched
(sliding-window or linear-attention layers) decodes in the caller's thread instead, one token
at a time.

It joins the model and the token tier, so it sits above both: `model/` runs a model on
whatever cache it is given and never imports `tiers/`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path

from transformers import DynamicCache

from .config import GenerationConfig, TokenTierConfig
from .model import kv
from .model.drafts import DraftSource
from .model.format_matcher import ReplyFormats
from .model.generation import Completion, GeneratedToken, generate_tokens, prefill
from .model.kv import kv_bytes_per_token, new_cache
from .model.loading import ChatModel
from .model.prompt import Message, Prompt, PromptRenderer
from .model.remote import RemoteModel, RemoteRunner
from .model.scheduler import Request
from .model.text_stream import TextStream
from .reply import TurnStats
from .tiers.token_tier import Checkout, TokenTier


def eos_token_ids(chat_model: ChatModel) -> set[int]:
    """Every id that ends a reply: the tokenizer's and the generation config's (chat models differ)."""
    eos = chat_model.tokenizer.eos_token_id
    generation_eos = chat_model.model.generation_config.eos_token_id
    return {i for e in (eos, generation_eos) for i in (e if isinstance(e, list) else [e]) if i is not None}


class ModelRunner:
    """Generates replies for the engine on the token tier's KV.

    Args:
        chat_model: the model and tokenizer.
        token_tier: where each session's KV is kept between turns.
        system_ids: the shared system-prompt ids a new session's KV starts from.
    """

    def __init__(self, chat_model: ChatModel, token_tier: TokenTier, system_ids: list[int]) -> None:
        self.chat_model = chat_model
        self.token_tier = token_tier
        self.system_ids = system_ids
        self.eos_ids = eos_token_ids(chat_model)
        self.reply_formats = ReplyFormats(chat_model.tokenizer, self.eos_ids)

    @property
    def drafting(self) -> bool:
        """Whether replies are drafted now (`Scheduler.draft_tokens`), so cached answers near a
        question are worth finding for its reply."""
        return self.chat_model.scheduler.draft_tokens > 0

    def _start(
        self, cache: DynamicCache, prompt: list[int], reused: int, params: GenerationConfig, answers: Sequence[str] = ()
    ) -> Request | Iterator[GeneratedToken]:
        """The reply to `prompt`, of which `cache` holds the first `reused` tokens, drafted from
        `answers` and the prompt: a scheduled request, or for an unbatchable cache the plain
        decoding loop."""
        matcher = self.reply_formats.matcher(params.reply_format) if params.reply_format is not None else None
        if kv.is_croppable(cache):
            answer_ids = [self.chat_model.tokenizer.encode(answer, add_special_tokens=False) for answer in answers]
            drafts = DraftSource(prompt, answer_ids)
            return self.chat_model.scheduler.submit(cache, prompt[reused:], params, self.eos_ids, matcher, drafts)
        return generate_tokens(self.chat_model.model, cache, prompt[reused:], params, self.eos_ids, matcher)

    @staticmethod
    def _stop(tokens: Request | Iterator[GeneratedToken], cache: DynamicCache) -> DynamicCache:
        """End the reply's generation; returns the KV, which covers the prompt and the tokens fed."""
        return tokens.cancel() if isinstance(tokens, Request) else cache

    def stream(
        self,
        key: str,
        laid_out: Prompt,
        params: GenerationConfig,
        stats: TurnStats,
        started: float,
        out: list[Message],
        prefix: list[int] | None = None,
        answers: Sequence[str] = (),
    ) -> Generator[str, None, None]:
        """Stream the model's reply on the KV kept under `key` and append it to `out`.

        `key` is the token-tier key (a session id, or the LangChain path's conversation key),
        `prefix` the shared system-prompt ids to start from (default: the engine's), and
        `answers` cached answers near the question, to draft the reply from. The reply is
        handed over through `out`, not returned: when the reader cancels, Python closes this
        generator and a return value would be lost.
        """
        prompt = laid_out.ids
        prefix = self.system_ids if prefix is None else prefix
        checkout = self.token_tier.checkout(key, prompt, prefix, len(prompt) + params.max_new_tokens)
        stats.prompt_tokens, stats.reused_tokens, stats.tier = len(prompt), checkout.reused, checkout.tier
        stats.prefilled_tokens = len(prompt) - checkout.reused
        generated: list[int] = []
        entropies: list[float] = []
        text_stream = TextStream(self.chat_model.tokenizer, params.stop)
        stats.finish_reason = "cancelled"
        tokens = self._start(checkout.cache, prompt, checkout.reused, params, answers)
        try:
            for token in tokens:
                if not generated:
                    stats.ttft_s = time.perf_counter() - started
                generated.append(token.token_id)
                entropies.append(token.entropy_bits)
                piece = text_stream.add(token.token_id)
                if piece:
                    yield piece
                if text_stream.stopped:
                    break
            stats.finish_reason = self._finish_reason(generated, text_stream)
            tail = text_stream.flush()
            if tail:
                yield tail
        except GeneratorExit:
            pass  # the reader stopped reading: keep what was generated
        except BaseException:
            self._stop(tokens, checkout.cache)
            self.token_tier.release(key)  # the session's KV is recomputed next turn
            raise
        cache = self._stop(tokens, checkout.cache)
        if isinstance(tokens, Request):
            stats.drafted_tokens, stats.accepted_tokens = tokens.drafted, tokens.accepted
        if not generated:
            self.token_tier.release(key)
            return
        # The worker may have fed a token or two this reader never took (it stopped at a stop string).
        kv.crop_to(cache, len(prompt) + len(generated) - 1)
        decode_s = time.perf_counter() - started - stats.ttft_s
        stats.generated_tokens = len(generated)
        stats.decode_tokens_per_s = (len(generated) - 1) / decode_s if len(generated) > 1 and decode_s > 0 else 0.0
        stats.mean_entropy_bits = sum(entropies) / len(entropies)
        # The KV covers the prompt and every reply token but the last, which was never fed.
        self.token_tier.checkin(key, prompt + generated[:-1], cache, latency_ms=stats.ttft_s * 1000)
        out.append(Message("assistant", text_stream.text, tuple(generated)))

    def answer(self, prompt: Prompt, params: GenerationConfig) -> Completion:
        """Answer `prompt` off the record from scratch (an answer-cache audit)."""
        completion = self.complete(prompt.ids, new_cache(self.chat_model.model.config), params)
        assert completion is not None  # nothing stops it
        return completion

    def complete(
        self,
        prompt: list[int],
        cache: DynamicCache,
        params: GenerationConfig,
        should_stop: Callable[[], bool] = lambda: False,
    ) -> Completion | None:
        """Answer `prompt` on `cache`, which already holds the prompt's first tokens; None if stopped."""
        reused = cache.get_seq_length()
        text_stream = TextStream(self.chat_model.tokenizer, params.stop)
        entropies, last = [], None
        tokens = self._start(cache, prompt, reused, params)
        try:
            for token in tokens:
                if should_stop():
                    return None
                text_stream.add(token.token_id)
                entropies.append(token.entropy_bits)
                last = token.token_id
                if text_stream.stopped:
                    break
        finally:
            self._stop(tokens, cache)
        mean_entropy = sum(entropies) / len(entropies) if entropies else 0.0
        return Completion(text_stream.text, mean_entropy, last in self.eos_ids)

    def decode_batches(self, question: list[int], batch_sizes: Sequence[int]) -> None:
        """Decode a few steps of each of `batch_sizes` rows together on the scheduler, keeping
        nothing, so that it has measured those batch sizes' step costs (and its prefill rate)
        before anyone predicts a turn's wait from them.

        Each row is a new session's first turn on `question`, from a copy of the system prompt's
        KV: a step's cost grows with the context it attends over, and rates measured on a few
        tokens of context made the first turns of a burst wait twice their prediction. A batch
        grows only while the token tier has room for another row.
        """
        prompt = self.system_ids + question
        for rows in batch_sizes:
            # No end-of-reply ids: every row decodes until all have joined, so the batch reaches `rows`.
            params = GenerationConfig(max_new_tokens=rows + 1)
            reserve = len(prompt) + params.max_new_tokens
            checkouts: list[Checkout] = []
            while len(checkouts) < rows and (not checkouts or self.token_tier.fits(reserve)):
                checkouts.append(self.token_tier.checkout(f"warm-up-{len(checkouts)}", prompt, self.system_ids, reserve))
            requests = [self.chat_model.scheduler.submit(c.cache, prompt[c.reused :], params, set()) for c in checkouts]
            for request in requests:
                for _ in request:
                    pass
            for index in range(len(checkouts)):
                self.token_tier.release(f"warm-up-{index}")  # never checked in: nothing is kept

    def _finish_reason(self, generated: list[int], text_stream: TextStream) -> str:
        if text_stream.stopped:
            return "stop"
        if generated and generated[-1] in self.eos_ids:
            return "eos"
        return "length"


def build_token_tier(chat_model: ChatModel, config: TokenTierConfig) -> TokenTier:
    """The token tier of `chat_model`'s KV; one built here can be shared by several engines (a
    server's tenants: one memory budget)."""
    hf_model = chat_model.model
    return TokenTier(
        config,
        model_config=hf_model.config,
        bytes_per_token=kv_bytes_per_token(hf_model.config, hf_model.dtype),
        prefill=lambda ids, cache: prefill(hf_model, ids, cache),
        spill_identity=(chat_model.identity, PromptRenderer(chat_model.tokenizer).template_hash),
        device=hf_model.device,
    )


def runner_for(
    model: ChatModel | RemoteModel, token_tier: TokenTierConfig | TokenTier | None, system_ids: list[int], spill_dir: Path
) -> ModelRunner | RemoteRunner:
    """An engine's way to its model: a local model runs on the token tier's KV (`token_tier`, one
    shared with other engines, or its settings: by default 1 GiB in memory, cold sessions spilled
    to `spill_dir`); a remote model's server keeps the KV itself."""
    if isinstance(model, RemoteModel):
        return RemoteRunner(model)
    if not isinstance(token_tier, TokenTier):
        token_tier = build_token_tier(model, token_tier or TokenTierConfig(spill_dir=spill_dir))
    return ModelRunner(model, token_tier, system_ids)
