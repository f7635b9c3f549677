"""A chat model served elsewhere, over the OpenAI API as vLLM, llama.cpp's server and Ollama speak it.

An engine on a remote model keeps every tier but its own token tier: sessions, dialogue,
drift, the turn tier and the answer cache work as on a local model, and the server's prefix
cache plays the token tier. That cache hits only while each request starts with exactly the
messages the last one sent, which the engine's prompt layout keeps so (the system message, then
the turns from a window start that only moves forward); `TurnStats.reused_tokens` is what the
server says it served from its cache (`usage.prompt_tokens_details.cached_tokens`), where it
says so.

A local tokenizer of the same model counts tokens, so that the prompt is laid out within the
context window before it is sent; the server renders and tokenizes the messages itself, and
the special-token strings a person typed reach it defused (`PlainText.defused`), so they cannot
forge a turn there either. Answers are stored in the answer cache only with the mean entropy
of their tokens, read from the top 20 log-probabilities the server returns; a server that
returns none has its answers served but never stored.

What it deliberately does not do: batch, schedule or admit turns (the server does), or
prefetch answers (that runs on a copy of the session's KV, which lives on the server).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import time
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import openai
from openai.types.chat import ChatCompletionMessageParam, ChatCompletionTokenLogprob

from ..config import GenerationConfig
from ..errors import ConfigError, ModelNotFoundError, RemoteModelError
from ..reply import TurnStats
from .generation import Completion
from .plain_text import PlainText
from .prompt import Message, Prompt

if TYPE_CHECKING:
    from openai.types.chat import ChatCompletionChunk
    from openai.types.completion_usage import CompletionUsage
    from transformers import PreTrainedTokenizerBase

UNSTATED_CONTEXT_WINDOW = 2048
"""The context size assumed of a server that does not state its own: llama.cpp's and Ollama's
smallest default, so a prompt laid out for it fits there (pass `context_window` for more)."""

TOP_LOGPROBS = 20
"""Log-probabilities asked for each reply token (the OpenAI API's most): the entropy is computed
over these, the rest of the distribution counted as one outcome, so it is a lower bound."""


def is_remote(name: str) -> bool:
    """Whether a model name is an endpoint's address rather than a local model."""
    return name.startswith(("http://", "https://"))


@dataclass(frozen=True)
class RemoteModel:
    """A model on an OpenAI-compatible server, with the tokenizer that counts its tokens here.

    `identity` names what the server says it serves (its model entry, less the time it was
    listed): cached answers are served only for the same entry. A server that swaps weights
    under an unchanged name and description is not told apart.
    """

    url: str
    name: str
    tokenizer: PreTrainedTokenizerBase
    context_window: int
    identity: str
    client: openai.OpenAI = field(repr=False, compare=False)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)


def connect_remote_model(
    url: str,
    model: str | None = None,
    tokenizer: str | PreTrainedTokenizerBase | None = None,
    context_window: int | None = None,
    api_key: str | None = None,
    timeout_s: float = 600.0,
) -> RemoteModel:
    """Connect to an OpenAI-compatible server and check that it serves the model.

    Args:
        url: the API's base address, e.g. `http://127.0.0.1:8080/v1`; `...#NAME` names the model.
        model: the served model's name; may be left out when the server serves one model.
        tokenizer: the model's tokenizer here: "bundled", a Hugging Face id, a path, or a loaded
            one. By default the served name is tried as an id or a path (a GGUF file included).
        context_window: the server's context size in tokens; by default what the server states
            (vLLM's `max_model_len`, llama.cpp's `n_ctx_train`), else the tokenizer's, else
            `UNSTATED_CONTEXT_WINDOW`.
        api_key: sent as a bearer token; by default `OPENAI_API_KEY`, or none.
        timeout_s: longest wait for one reply.

    Raises:
        RemoteModelError: the server cannot be reached, or does not serve `model`.
        ModelNotFoundError: no tokenizer for the model could be loaded here.
    """
    url, _, named = url.partition("#")
    model = model or named or None
    client = openai.OpenAI(base_url=url.rstrip("/"), api_key=api_key or _env_key(), timeout=timeout_s)
    try:
        entries = [entry.model_dump() for entry in client.models.list()]
    except openai.APIError as exc:
        raise _remote_error(url, exc) from None
    served = [str(entry["id"]) for entry in entries]
    if model is None and len(served) != 1:
        raise RemoteModelError(
            f"{url} serves {len(served)} models ({', '.join(served) or 'none'}): name the one to use ({url}#NAME)."
        )
    name = model if model is not None else served[0]
    if name not in served:
        raise RemoteModelError(f"{url} does not serve {name!r}; it serves: {', '.join(served) or 'nothing'}.")
    entry = next(e for e in entries if e["id"] == name)
    loaded = _load_tokenizer(name, tokenizer)
    window = context_window or _stated_context_window(entry) or _tokenizer_window(loaded) or UNSTATED_CONTEXT_WINDOW
    described = json.dumps({k: v for k, v in entry.items() if k != "created"}, sort_keys=True, default=str)
    identity = f"remote:{name}@{hashlib.sha256(described.encode()).hexdigest()[:16]}"
    return RemoteModel(url, name, loaded, window, identity, client)


def _env_key() -> str:
    return os.environ.get("OPENAI_API_KEY") or "none"  # the client insists on one; local servers ignore it


def _stated_context_window(entry: dict[str, Any]) -> int | None:
    meta = entry.get("meta") or {}
    stated = entry.get("max_model_len") or meta.get("n_ctx") or meta.get("n_ctx_train")
    return int(stated) if stated else None


def _tokenizer_window(tokenizer: PreTrainedTokenizerBase) -> int | None:
    # Tokenizers that know no limit say so with a huge placeholder (int(1e30)).
    limit = int(tokenizer.model_max_length)
    return limit if limit < 10_000_000 else None


def _load_tokenizer(name: str, tokenizer: str | PreTrainedTokenizerBase | None) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer, PreTrainedTokenizerBase

    from .loading import bundled_chat_dir

    if isinstance(tokenizer, PreTrainedTokenizerBase):
        return tokenizer
    source = tokenizer or name
    try:
        if source == "bundled":
            return AutoTokenizer.from_pretrained(bundled_chat_dir())
        if source.endswith(".gguf") and Path(source).is_file():
            return AutoTokenizer.from_pretrained(Path(source).parent, gguf_file=Path(source).name)
        return AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError) as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ModelNotFoundError(
            f"No tokenizer for {name!r} from {source!r}: chatcache counts a remote model's tokens "
            "itself to fit the prompt to its context window. Pass its tokenizer (a Hugging Face "
            f"id, a path, or 'bundled'). (Loader said: {first_line})"
        ) from None


def _remote_error(url: str, exc: openai.APIError) -> RemoteModelError:
    if isinstance(exc, openai.APIStatusError):
        return RemoteModelError(f"{url} answered {exc.status_code}: {exc.message}")
    return RemoteModelError(f"{url} could not be reached: {exc.message}")


def entropy_bits(top: Iterable[ChatCompletionTokenLogprob]) -> list[float]:
    """Each token's entropy in bits over its top log-probabilities, the rest as one outcome."""
    values = []
    for token in top:
        probabilities = [math.exp(alternative.logprob) for alternative in token.top_logprobs]
        rest = max(0.0, 1.0 - sum(probabilities))
        values.append(-sum(p * math.log2(p) for p in [*probabilities, rest] if p > 0))
    return values


@dataclass
class _Reading:
    """What a reply's chunks said beyond its text."""

    finish: str | None = None
    usage: CompletionUsage | None = None
    entropies: list[float] = field(default_factory=list)

    def read(self, chunk: ChatCompletionChunk) -> str:
        """The chunk's text, noting its finish reason, usage and log-probabilities."""
        self.usage = chunk.usage or self.usage
        if not chunk.choices:
            return ""
        choice = chunk.choices[0]
        if choice.logprobs is not None and choice.logprobs.content:
            self.entropies += entropy_bits(choice.logprobs.content)
        self.finish = choice.finish_reason or self.finish
        return choice.delta.content or ""


class RemoteRunner:
    """Generates the engine's replies on a remote model: the prompt's messages are sent whole
    each turn, and the server's prefix cache reuses what the last request shared with them."""

    def __init__(self, model: RemoteModel) -> None:
        self.model = model
        self.plain_text = PlainText(model.tokenizer)
        self.schema_in_json_object = False  # the server reads a schema only as llama-cpp-python does

    @staticmethod
    def check(params: GenerationConfig) -> None:
        """Refuse settings no OpenAI-compatible server takes (the engine asks before a turn starts)."""
        reply_format = params.reply_format
        if reply_format is not None and reply_format.schema is None:
            raise ConfigError(
                f"A remote model takes a reply format as a JSON schema only (OpenAI's response_format), not {reply_format.kind}."
            )

    def _request(self, key: str, prompt: Prompt, params: GenerationConfig) -> openai.Stream[ChatCompletionChunk]:
        """Start the server's reply. A reply format goes as OpenAI's `response_format`
        (`json_schema`: OpenAI, vLLM, llama.cpp's own server); a server that refuses that type
        is asked again, and from then on, the way llama-cpp-python's server reads a schema
        (`json_object` with a `schema`)."""
        try:
            return self._create(key, prompt, params)
        except openai.APIError as exc:
            if params.reply_format is None or self.schema_in_json_object or "response_format" not in str(exc):
                raise _remote_error(self.model.url, exc) from None
        self.schema_in_json_object = True
        try:
            return self._create(key, prompt, params)
        except openai.APIError as exc:
            raise _remote_error(self.model.url, exc) from None

    def _create(self, key: str, prompt: Prompt, params: GenerationConfig) -> openai.Stream[ChatCompletionChunk]:
        messages: list[ChatCompletionMessageParam] = [
            {"role": m.role, "content": self.plain_text.defused(m.content)}  # type: ignore[misc]
            for m in prompt.messages
        ]
        self.check(params)
        reply_format = params.reply_format
        formatted: dict[str, Any] = {}
        if reply_format is not None and self.schema_in_json_object:
            formatted["response_format"] = {"type": "json_object", "schema": reply_format.schema}
        elif reply_format is not None:
            formatted["response_format"] = {"type": "json_schema", "json_schema": {"name": "reply", "schema": reply_format.schema}}
        response: openai.Stream[ChatCompletionChunk] = self.model.client.chat.completions.create(
            **formatted,
            model=self.model.name,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            max_tokens=params.max_new_tokens,
            temperature=params.temperature,
            top_p=params.top_p,
            stop=list(params.stop) or None,
            seed=params.seed,
            logprobs=True,
            top_logprobs=TOP_LOGPROBS,
            # vLLM's and llama.cpp's own names for the repetition penalty (llama.cpp's
            # default is not 1), and llama.cpp's switch for its prompt cache. The session
            # header lets a session-affinity router (vLLM's production stack) pin the
            # conversation to the replica holding its KV.
            extra_body={
                "repetition_penalty": params.repetition_penalty,
                "repeat_penalty": params.repetition_penalty,
                "cache_prompt": True,
            },
            extra_headers={"X-Session-Id": key},
        )
        return response

    def stream(
        self,
        key: str,
        prompt: Prompt,
        params: GenerationConfig,
        stats: TurnStats,
        started: float,
        out: list[Message],
        prefix: list[int] | None = None,
    ) -> Generator[str, None, None]:
        """Stream the server's reply to `prompt` and append it to `out` (see `ModelRunner.stream`).

        `key` names the conversation to the server's router; `prefix` is the local runner's
        and has no meaning here (the server finds the shared start itself).
        """
        stats.tier, stats.finish_reason = "remote", "cancelled"
        stats.prompt_tokens = stats.prefilled_tokens = len(prompt.ids)
        reading, pieces = _Reading(), list[str]()
        response = self._request(key, prompt, params)
        try:
            for chunk in response:
                piece = reading.read(chunk)
                if piece:
                    if not pieces:
                        stats.ttft_s = time.perf_counter() - started
                    pieces.append(piece)
                    yield piece
        except GeneratorExit:
            pass  # the reader stopped reading: closing the response stops the server too
        except openai.APIError as exc:
            raise _remote_error(self.model.url, exc) from None
        finally:
            response.close()
        if reading.finish is None and not pieces:
            return
        text = "".join(pieces)
        self._count(stats, reading, text, started)
        if reading.finish is not None:
            stats.finish_reason = _finish_reason(reading.finish, params)
        out.append(Message("assistant", text))

    def _count(self, stats: TurnStats, reading: _Reading, text: str, started: float) -> None:
        """The turn's token counts, as the server states them where it does."""
        usage = reading.usage
        stats.generated_tokens = usage.completion_tokens if usage else len(self.plain_text.encode(text))
        if usage is not None:
            stats.prompt_tokens = usage.prompt_tokens
            details = usage.prompt_tokens_details
            stats.reused_tokens = (details.cached_tokens or 0) if details is not None else 0
            stats.prefilled_tokens = stats.prompt_tokens - stats.reused_tokens
        decode_s = time.perf_counter() - started - stats.ttft_s
        if stats.generated_tokens > 1 and decode_s > 0:
            stats.decode_tokens_per_s = (stats.generated_tokens - 1) / decode_s
        # No log-probabilities: the answer's certainty is unknown, so the answer cache keeps none of them.
        stats.mean_entropy_bits = sum(reading.entropies) / len(reading.entropies) if reading.entropies else math.inf

    def answer(self, prompt: Prompt, params: GenerationConfig) -> Completion:
        """Answer `prompt` off the record (an answer-cache audit)."""
        stats, out = TurnStats(), list[Message]()
        pieces = list(self.stream("audit", prompt, params, stats, time.perf_counter(), out))
        return Completion("".join(pieces), stats.mean_entropy_bits, stats.finish_reason == "eos")


def _finish_reason(finish: str, params: GenerationConfig) -> str:
    """Ours for the server's: its "stop" is the model ending the reply, or one of our stop strings."""
    if finish == "stop":
        return "stop" if params.stop else "eos"
    return finish
