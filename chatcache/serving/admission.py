"""Admission control (the design's ACPC): refuse what cannot start in time, before any work.

Each request that needs the model gets a predicted time to first token when the engine knows
what it must prefill (the prompt less what the token tier can reuse), before the turn records
anything. The scheduler prefills one chunk of the oldest waiting request per step and decodes
every running request in the same step, so a newcomer waits for every prefill chunk ahead of
it and its own, each step also paying one batched decode at the batch it will have grown to:

    predicted = (tokens ahead + own tokens) x prefill seconds per token
                + (chunks ahead + own chunks) x decode step seconds at (running + ahead + 1) rows
                + the restore of the session's KV from disk, if it was spilled (the token
                  tier's measured seconds per byte of spill file)
                + the engine's own time before the model (learned: the mean of actual - predicted)

with the rates the scheduler measures while serving. A request that finds the model idle is
judged without the learned overhead: nothing is ahead of it, and only requests let in relearn
the overhead, so after a slow spell it must not refuse everything for good. Over the SLO, with
`max_queue` requests
already waiting for their first token, while one admitted earlier has waited longer than the
SLO (the prediction is evidently behind), or with an SLO when the token tier has no memory for
the turn until a running one ends (a wait nothing here predicts), the request is refused with
a retry time.
Answer-cache hits and the flow's own questions never reach this point: they cost no model time.

The door (`Ticket.hold`) answers the same question before any work, for a request that
prefills at least its new message (everything before it may be in the session's KV), restores
the session's KV if it is on disk, and holds at least that KV, its message and its reply in
memory while it runs (`ChatEngine.least_cost`): the server refuses at once (well under 50 ms)
a turn that surely needs the model and surely cannot start in time, and lets through the turns
the answer cache may serve. A request let through keeps its place in the queue from then on,
counted at those fewest tokens until the engine's `admit` knows its prefill: the turn's work
before the model (its session's lease, the embedder, the prompt) takes hundreds of
milliseconds under load, and without the place every request of a burst saw the same short
queue at the door and was refused only by the engine, after that work.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from chatcache import Scheduler

OVERHEAD_WEIGHT = 0.2  # weight of the newest turn in the learned overhead (a moving average, as the scheduler's rates)


class Overloaded(Exception):
    """Refused by admission control or a rate limit; the server's 429."""

    def __init__(self, reason: str, retry_after_s: float, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.retry_after_s = retry_after_s


@dataclass(eq=False)
class Ticket:
    """One request's passage through admission; `admit` is the engine's `Admit` hook."""

    control: AdmissionControl
    predicted_s: float | None = None  # None: the request never needed the model
    model_s: float = 0.0  # the part the scheduler's rates predict, without the learned overhead
    waiting: bool = False
    admitted_at: float = 0.0
    held: bool = False  # a place kept at the door, its prefill not known yet
    kv_tokens: int = 0  # while held: the fewest KV tokens its turn will hold in memory

    def hold(self, least_prefill_tokens: int = 0, kv_tokens: int = 0, restore_s: float = 0.0) -> Overloaded | None:
        """At the door: why a request prefilling at least `least_prefill_tokens`, holding at
        least `kv_tokens` of KV and restoring its session's KV from disk in `restore_s` would
        surely be refused now; if it would not, it keeps its place in the queue until `admit`
        or the end."""
        return self.control._hold(self, least_prefill_tokens, kv_tokens, restore_s)

    def admit(self, prefill_tokens: int, fits_in_memory: bool = True, restore_s: float = 0.0) -> None:
        self.control._admit(self, prefill_tokens, fits_in_memory, restore_s)

    def started(self, actual_ttft_s: float) -> float | None:
        """The first token arrived (or the turn ended): leave the queue; returns the prediction's error."""
        self.control._leave(self)
        if self.predicted_s is None:
            return None
        self.control._learn(actual_ttft_s - self.model_s)
        return actual_ttft_s - self.predicted_s

    def close(self) -> None:
        """The request ended without a first token (failed or cancelled)."""
        self.control._leave(self)


@dataclass
class AdmissionControl:
    """Admits requests for one model's scheduler.

    Args:
        scheduler: the model's scheduler (its rates, chunk size and running requests).
        slo_s: the TTFT a request may be predicted to wait; None admits any wait.
        max_queue: requests waiting for their first token at most.
    """

    scheduler: Scheduler
    slo_s: float | None
    max_queue: int
    memory_room: Callable[[int], bool] = lambda kv_tokens: True  # would turns holding this much KV more get their memory now
    overhead_s: float = 0.0
    _waiting: dict[Ticket, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def ticket(self) -> Ticket:
        return Ticket(self)

    @property
    def waiting(self) -> int:
        """Requests admitted and still waiting for their first token."""
        with self._lock:
            return len(self._waiting)

    def predict(self, prefill_tokens: int, ahead: list[int]) -> float:
        """The model's part of the time to first token of a request prefilling `prefill_tokens`
        behind requests prefilling `ahead`, at the scheduler's rates of late."""
        scheduler = self.scheduler
        rates, chunk = scheduler.rates, scheduler.prefill_chunk
        per_token = rates.prefill_s_per_token or 0.0
        steps = sum(math.ceil(tokens / chunk) for tokens in (*ahead, prefill_tokens))
        running = scheduler.running
        rows = min(scheduler.max_batch, running + len(ahead) + 1)
        step_s = rates.decode_step(rows) if running or ahead else 0.0
        return (sum(ahead) + prefill_tokens) * per_token + steps * step_s

    def _hold(self, ticket: Ticket, least_prefill_tokens: int, kv_tokens: int, restore_s: float) -> Overloaded | None:
        with self._lock:  # decided and queued together, as in `_admit`
            refusal = self._refusal(restore_s + self.predict(least_prefill_tokens, list(self._waiting.values())))
            held_at_door = sum(t.kv_tokens for t in self._waiting if t.held)  # let in, their KV not reserved yet
            if refusal is None and self.slo_s is not None and not self.memory_room(held_at_door + kv_tokens):
                refusal = Overloaded("memory", 1.0, "The running turns hold all the KV memory.")
            if refusal is None:
                ticket.held, ticket.waiting, ticket.admitted_at, ticket.kv_tokens = True, True, time.monotonic(), kv_tokens
                self._waiting[ticket] = least_prefill_tokens
            return refusal

    def _refusal(self, model_s: float) -> Overloaded | None:
        """The refusal for a request whose model part is predicted at `model_s` seconds, given the queue (lock held)."""
        predicted = model_s + self.overhead_s
        if len(self._waiting) >= self.max_queue:
            return Overloaded("queue", max(1.0, predicted), f"{len(self._waiting)} requests are already waiting for the model.")
        if self.slo_s is None:
            return None
        if not self._waiting and not self.scheduler.running and not self.scheduler.waiting:
            # Nothing is ahead of it: judged on its own prefill, not the learned overhead, which
            # after a slow spell could alone exceed the SLO and, since only requests let in
            # relearn it, would then refuse every request for good.
            predicted = model_s
        if predicted > self.slo_s:
            return Overloaded(
                "slo", max(1.0, predicted - self.slo_s), f"The first token is predicted in {predicted:.1f} s, over the {self.slo_s:g} s target."
            )
        oldest = min((t.admitted_at for t in self._waiting if not t.held), default=None)  # a held one may wait for its session
        if oldest is not None and (late := time.monotonic() - oldest) > self.slo_s:
            return Overloaded("slo", max(1.0, late - self.slo_s), f"A request admitted {late:.1f} s ago still waits for its first token.")
        return None

    def _admit(self, ticket: Ticket, prefill_tokens: int, fits_in_memory: bool, restore_s: float) -> None:
        with self._lock:  # decided and queued together: a burst cannot all see the same empty queue
            self._waiting.pop(ticket, None)  # its place at the door, judged again on its known prefill
            ticket.held = ticket.waiting = False
            model_s = restore_s + self.predict(prefill_tokens, list(self._waiting.values()))
            predicted = model_s + self.overhead_s
            refusal = self._refusal(model_s)
            if refusal is None and not fits_in_memory and self.slo_s is not None:
                # It would wait for a running turn to end, which nothing here predicts.
                refusal = Overloaded("memory", max(1.0, predicted), "The running turns hold all the KV memory.")
            if refusal is not None:
                raise refusal
            ticket.predicted_s, ticket.model_s, ticket.waiting = predicted, model_s, True
            if not ticket.admitted_at:
                ticket.admitted_at = time.monotonic()
            self._waiting[ticket] = prefill_tokens

    def _leave(self, ticket: Ticket) -> None:
        with self._lock:
            self._waiting.pop(ticket, None)
            ticket.waiting = ticket.held = False

    def _learn(self, overhead_s: float) -> None:
        with self._lock:
            self.overhead_s = (1 - OVERHEAD_WEIGHT) * self.overhead_s + OVERHEAD_WEIGHT * max(0.0, overhead_s)
