"""One model worker for every turn: each step decodes all running requests in one forward pass.

Many conversations at once used to mean as many threads each decoding one token at a time on
the same cores. Now a turn hands its request (the session's KV checked out of the token tier,
the prompt tokens it lacks, its own generation settings) to the `Scheduler`, whose worker
thread owns the model. Each step the worker prefills one chunk (up to `PREFILL_CHUNK` tokens) of
the oldest arriving request on that request's own cache, then decodes one token for every
running request at once on `BatchKV`. Chunks keep a long prompt from stalling the streams
already running for longer than one chunk. (Packing the arrivals' chunks into one step, up to
512 tokens over them, measured side by side, interleaved twice, at 8 conversations under 600
tokens: the same throughput, 37.2 and 40.0 tokens/s against 36.2 and 41.0; a better TTFT p99,
2.2 and 2.4 s against 3.0 and 2.9 s; but a worse p50, 884 and 999 ms against 730 and 676 ms.)

A request may carry drafts (`drafts.DraftSource`: n-grams of its prompt, cached answers). A
step then feeds such a row its last token and up to `draft_tokens` drafted ones at once, picks a
token from the logits after each in turn, and stops at the first pick that differs from the
draft: every pick is made from what plain decoding picks from after the same tokens, so several
tokens may come of one step and the reply is plain decoding's (greedy) or has its distribution
(sampled: `generation.pick` keeps a drafted token with the probability the sampler gives it).
The row keeps the KV of the tokens it accepted (`BatchKV.end_step`); rows without drafts are
fed padding that nothing keeps. Rows in a reply format and rows with a repetition penalty do not
draft: they decode as before.

A request's tokens reach its caller through a queue; the caller may stop reading at any time
(`Request.cancel`) and gets the KV back covering everything the worker fed, which the token
tier keeps. The worker never holds the token tier's lock: KV is checked out before a request is
submitted and checked in after it ends, so the memory budget counts every running request.

Left to later: preemption under memory pressure, and running the prefill chunks of several
requests in one forward pass (each has its own cache of its own length).
"""

from __future__ import annotations

import bisect
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from .batch_kv import BatchKV
from .compiled_decode import CompiledDecode
from ..config import GenerationConfig
from .draft_length import DraftLength
from .drafts import DraftSource
from ..worker_threads import close_at_exit
from .generation import REPEAT_WINDOW, GeneratedToken, forward, next_token
from .intra_op_threads import give_up_intra_op_threads, release_openmp_pool, take_intra_op_threads
from .format_matcher import FormatError, FormatMatcher

PREFILL_CHUNK = 512  # prompt tokens one step prefills of one arriving request
MAX_BATCH = 32  # requests decoded at once; more wait for a row
# Drafting is off by default: on the bundled model, 4 greedy replies quoting a system prompt's
# policy at N = 1 accepted 136 of 1,040 drafted tokens (13%) at 8 a step, and decoded at 1.4
# tokens/s against 1.8 without (medians, interleaved, on a loaded 2-core machine). Each row's
# draft length now follows its acceptance (`draft_length`); it has not been measured yet.
DRAFT_TOKENS = 0  # drafted tokens a row is fed at most in one step, after its last token
RATE_WEIGHT = 0.2  # weight of the newest step in the measured rates (an exponential moving average)
log = logging.getLogger("chatcache")


@dataclass(eq=False)
class Request:
    """One reply being generated: what the worker needs, and what it hands back."""

    cache: DynamicCache
    pending: list[int]
    params: GenerationConfig
    eos_ids: frozenset[int]
    matcher: FormatMatcher | None = None  # the reply format's, if the reply has one
    drafts: DraftSource | None = None  # what the reply is drafted from, if it drafts
    tokens: queue.SimpleQueue[GeneratedToken | BaseException | None] = field(default_factory=queue.SimpleQueue)
    generated: int = 0
    recent: deque[int] = field(default_factory=lambda: deque(maxlen=REPEAT_WINDOW))  # for the repetition penalty
    next_id: int | None = None
    rng: torch.Generator | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    drafted: int = 0  # draft tokens fed to the model
    accepted: int = 0  # of those, the ones the model picked itself
    draft_length: DraftLength = field(default_factory=DraftLength)  # how many it drafts next

    def __iter__(self) -> Iterator[GeneratedToken]:
        """The tokens as they are picked; the last one ends the reply (end of turn or length)."""
        while (item := self.tokens.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            yield item

    def cancel(self) -> DynamicCache:
        """Stop generating (a no-op once the reply ended); returns the KV once the worker let go of
        it: the prompt plus every generated token the worker fed back, all but the last picked."""
        self.cancelled.set()
        self.done.wait()
        return self.cache


@dataclass
class StepRates:
    """What the worker's steps cost lately, for predicting a request's time to first token.

    A decode step reads every weight once whatever the batch, and each row adds its own
    attention and KV: its cost is measured per batch size and read off the line through the
    measured sizes nearest the one asked about.

    Attributes:
        prefill_s_per_token: seconds per prompt token of a prefill chunk; None until measured.
        decode_step_s: seconds of one batched decode step, by the rows decoded; empty until measured.
    """

    prefill_s_per_token: float | None = None
    decode_step_s: dict[int, float] = field(default_factory=dict)

    def record_prefill(self, tokens: int, seconds: float) -> None:
        self.prefill_s_per_token = _moving(self.prefill_s_per_token, seconds / tokens)

    def record_decode(self, rows: int, seconds: float) -> None:
        self.decode_step_s[rows] = _moving(self.decode_step_s.get(rows), seconds)

    def decode_step(self, rows: int) -> float:
        """Seconds of a decode step of `rows` rows: measured, or between (or beyond) the nearest two measured sizes."""
        points = sorted(self.decode_step_s.items())
        if len(points) < 2:
            return points[0][1] if points else 0.0
        after = min(max(bisect.bisect_right([size for size, _ in points], rows), 1), len(points) - 1)
        (low, low_s), (high, high_s) = points[after - 1], points[after]
        slope = max(0.0, (high_s - low_s) / (high - low))
        return max(0.0, low_s + slope * (rows - low))


def _moving(average: float | None, value: float) -> float:
    return value if average is None else (1 - RATE_WEIGHT) * average + RATE_WEIGHT * value


class Scheduler:
    """Owns the model and runs every request submitted to it, batching their decodes.

    Args:
        model: the causal LM; only the worker calls it.
        max_batch: requests decoded together at most.
        prefill_chunk: prompt tokens prefilled per step for one request.
        draft_tokens: drafted tokens a row is fed at most per step (0: no drafting); may be
            changed between steps.
        compiled: run the one-token decode step compiled by inductor (`compiled_decode`): the
            same products fused, compiled (or loaded from inductor's cache on disk) for every
            batch size bucket up to `max_batch` by the worker before it takes its first request.
    """

    def __init__(
        self,
        model: PreTrainedModel,
        max_batch: int = MAX_BATCH,
        prefill_chunk: int = PREFILL_CHUNK,
        draft_tokens: int = DRAFT_TOKENS,
        compiled: bool = False,
    ) -> None:
        if max_batch < 1 or prefill_chunk < 1 or draft_tokens < 0:
            raise ValueError("max_batch and prefill_chunk must be at least 1, draft_tokens at least 0")
        self.model = model
        self.max_batch = max_batch
        self.prefill_chunk = prefill_chunk
        self.draft_tokens = draft_tokens
        self._compiled = CompiledDecode(model) if compiled else None
        self._inbox: deque[Request] = deque()
        self._prefilling: deque[Request] = deque()
        self._batch = BatchKV(model.config)
        self._running: list[Request] = []  # row i of the batch is _running[i]
        self._wake = threading.Condition()
        self._closed = False
        self.peak_running = 0  # the most requests one decode step has run together
        self.rates = StepRates()  # written by the worker only
        threads_taken = threading.Event()
        self._worker = threading.Thread(target=self._work, args=(threads_taken,), name="chatcache-model", daemon=True)
        self._worker.start()
        close_at_exit(self)
        threads_taken.wait()
        give_up_intra_op_threads()  # after the worker took them: only its thread makes an OpenMP pool

    def submit(
        self,
        cache: DynamicCache,
        new_ids: list[int],
        params: GenerationConfig,
        eos_ids: set[int],
        matcher: FormatMatcher | None = None,
        drafts: DraftSource | None = None,
    ) -> Request:
        """Queue a reply on `cache` after the prompt tokens `new_ids` (at least one), within the
        reply format `matcher` follows, if any, drafted from `drafts` if it may be (`drafts_allowed`)."""
        if not new_ids:
            raise ValueError("at least one prompt token must be left to prefill")
        rng = torch.Generator().manual_seed(params.seed) if params.seed is not None else None
        drafts = drafts if drafts_allowed(params, matcher) else None
        request = Request(cache, list(new_ids), params, frozenset(eos_ids), matcher, drafts, rng=rng)
        with self._wake:
            if self._closed:
                raise RuntimeError("the scheduler is closed")
            self._inbox.append(request)
            self._wake.notify()
        return request

    @property
    def running(self) -> int:
        """Requests decoding now."""
        return len(self._running)

    @property
    def waiting(self) -> int:
        """Requests submitted and not yet decoding (queued or prefilling)."""
        with self._wake:
            return len(self._inbox) + len(self._prefilling)

    def close(self) -> None:
        """Finish nothing new: fail what is queued or running, and stop the worker."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        self._worker.join()

    # -- the worker ---------------------------------------------------------------------

    def _work(self, threads_taken: threading.Event) -> None:
        take_intra_op_threads()
        threads_taken.set()
        if self._compiled is not None:
            self._warm_up(self._compiled)
        while True:
            with self._wake:
                while not (self._closed or self._inbox or self._prefilling or self._running):
                    release_openmp_pool()  # an idle worker holds no threads another model could use
                    self._wake.wait()
                if self._closed:
                    break
                self._prefilling.extend(self._inbox)
                self._inbox.clear()
            try:
                with torch.no_grad():
                    self._step()
            except BaseException as error:  # noqa: BLE001 - every caller hears of it, the worker goes on
                log.exception("model step failed")
                self._fail_all(error)
        self._fail_all(RuntimeError("the scheduler was closed"))

    def _warm_up(self, compiled: CompiledDecode) -> None:
        """Compile the decode step of every batch size bucket up to `max_batch` rows before the
        first request: a request queued meanwhile waits as it would for its own step's compile,
        and no step's time (which admission control predicts waits from) includes a compile."""
        try:
            with torch.no_grad():
                seconds = compiled.warm_up(self.max_batch)
        except Exception:  # noqa: BLE001 - a step compiles its bucket itself, or fails to its callers
            log.exception("compiling the decode step failed")
            return
        log.info("compiled decode step ready for up to %d rows in %.1f s", self.max_batch, seconds)

    def _step(self) -> None:
        """Drop cancelled requests, prefill one chunk, decode one token for every running request."""
        for request in [r for r in self._prefilling if r.cancelled.is_set()]:
            self._prefilling.remove(request)
            self._finish(request)
        for row in reversed(range(len(self._running))):
            if self._running[row].cancelled.is_set():
                self._leave(row)
        if self._prefilling and len(self._running) < self.max_batch:
            self._prefill_chunk(self._prefilling[0])
        if self._running:
            self._decode()

    def _prefill_chunk(self, request: Request) -> None:
        chunk, request.pending = request.pending[: self.prefill_chunk], request.pending[self.prefill_chunk :]
        started = time.perf_counter()
        logits = forward(self.model, chunk, request.cache)
        self.rates.record_prefill(len(chunk), time.perf_counter() - started)
        if request.pending:
            return
        self._prefilling.popleft()
        if self._emit(request, logits):
            self._finish(request)
        else:
            self._batch.join(request.cache, room=request.params.max_new_tokens)
            request.cache.reset()  # its KV lives in the batch until it leaves
            self._running.append(request)

    def _decode(self) -> None:
        """Feed every running row its last token and its drafts, if any; pick and keep what each accepts."""
        self.peak_running = max(self.peak_running, len(self._running))
        started = time.perf_counter()
        drafts = [self._draft(request) for request in self._running]
        fed = 1 + max(map(len, drafts))
        if self._compiled is not None and fed == 1:
            logits = self._compiled(self._batch, [r.next_id or 0 for r in self._running]).float().cpu()
        else:
            logits = self._eager_logits(drafts, fed)
        self.rates.record_decode(len(self._running), time.perf_counter() - started)
        outcomes = [self._accept(request, draft, logits[row]) for row, (request, draft) in enumerate(zip(self._running, drafts))]
        self._batch.end_step([kept for kept, _ in outcomes])
        for row in reversed(range(len(self._running))):
            if outcomes[row][1]:
                self._leave(row)

    def _eager_logits(self, drafts: list[list[int]], fed: int) -> torch.Tensor:
        """Each row's logits after each of its `fed` tokens, (rows, fed, vocab), from the uncompiled model."""
        mask = self._batch.begin_step(fed)
        # A row drafting fewer tokens than the longest is padded with its last token; nothing keeps those.
        rows = [[r.next_id, *draft] + [r.next_id] * (fed - 1 - len(draft)) for r, draft in zip(self._running, drafts)]
        ids = torch.tensor(rows, device=self.model.device)
        positions = self._batch.positions().to(self.model.device)
        output = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=self._batch, use_cache=True)
        logits: torch.Tensor = output.logits.float().cpu()
        return logits

    def _draft(self, request: Request) -> list[int]:
        """The tokens the request is to be fed after its last one: none unless it drafts, as many
        as its acceptance lately allows (`DraftLength`), and never more than its reply has room
        for after the token the model adds."""
        if request.drafts is None:
            return []
        room = request.params.max_new_tokens - request.generated - 1
        return request.drafts.propose(min(request.draft_length.next(self.draft_tokens), room))

    def _accept(self, request: Request, draft: list[int], logits: torch.Tensor) -> tuple[int, bool]:
        """Pick tokens along the row's fed tokens while each pick is the draft's next token.

        `logits[i]` follows the last token and the draft's first `i` tokens, so it is what plain
        decoding picks from as long as every earlier pick equalled the draft; a sampled pick there
        keeps the draft's token by the speculative-sampling rule (`generation.pick`). Returns how many
        fed tokens to keep (the last token and the accepted drafts: one per pick) and whether
        the reply ended.
        """
        index = 0
        while True:
            proposed = draft[index] if index < len(draft) else None
            ended = self._emit(request, logits[index], proposed)
            agreed = proposed is not None and request.next_id == proposed
            if ended or not agreed:
                break
            index += 1
        accepted = index + agreed
        request.drafted += len(draft)
        request.accepted += accepted
        request.draft_length.record(len(draft), accepted)
        return index + 1, ended

    def _emit(self, request: Request, logits: torch.Tensor, draft: int | None = None) -> bool:
        """Pick and hand over the request's next token, where a draft proposed `draft` if it did;
        True when that token ends the reply."""
        try:
            generated = next_token(logits, request.params, request.rng, request.recent, request.matcher, draft)
        except FormatError as error:  # this reply's fault alone: the others go on
            log.exception("reply format broken")
            request.tokens.put(error)
            return True
        request.tokens.put(generated)
        request.generated += 1
        request.next_id = generated.token_id
        if request.drafts is not None:
            request.drafts.append(generated.token_id)
        return generated.token_id in request.eos_ids or request.generated >= request.params.max_new_tokens

    def _leave(self, row: int) -> None:
        request = self._running[row]
        request.cache, moved = self._batch.leave(row, self.model.config)
        if moved is not None:
            self._running[row] = self._running[moved]
        self._running.pop()
        self._finish(request)

    def _finish(self, request: Request) -> None:
        request.tokens.put(None)
        request.done.set()

    def _fail_all(self, error: BaseException) -> None:
        while self._running:
            self._running[-1].tokens.put(error)
            self._leave(len(self._running) - 1)
        for request in (*self._prefilling, *self._inbox):
            request.tokens.put(error)
            self._finish(request)
        self._prefilling.clear()
        self._inbox.clear()


def drafts_allowed(params: GenerationConfig, matcher: FormatMatcher | None) -> bool:
    """Whether a reply may draft: greedy or sampled, with no reply format and no repetition penalty.

    A format's matcher and the penalty would be followed pick by pick along a draft as they are
    (`generation.next_token`), but are not yet tested with drafts.
    """
    return matcher is None and params.repetition_penalty == 1.0
