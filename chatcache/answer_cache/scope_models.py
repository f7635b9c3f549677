"""What the cache learns from each scope's stored wordings, refitted in one background thread.

A scope's answer head (`heads.py`) and, under an error bound, its calibration
(`calibration.py`) are fitted on the scope's live entries. Both are refitted together when the
live entries have changed in number by `refit_share` since the last fit (a head of 8,000
entries takes about 3 s on 2 cores and a calibration about five times that, so neither is
redone per store), or at once by `fit_now` after a bulk load. Lookups use whichever is current.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .bound import min_evidence
from .calibration import Calibration, calibrate, leave_one_out
from .heads import AnswerHead, fit_head


@dataclass(frozen=True)
class ScopeRows:
    """A scope's live entries, row for row: question vectors, answer keys and question texts."""

    vectors: np.ndarray
    answers: list[str]
    questions: list[str]


@dataclass(frozen=True)
class Bound:
    """The user's error bound: at most `max_error_rate` of answers served by meaning wrong, `confidence` sure."""

    max_error_rate: float
    confidence: float


@dataclass(frozen=True)
class ScopeModel:
    head: AnswerHead | None
    calibration: Calibration | None
    entries: int  # how many entries both were fitted on


Snapshot = Callable[[str], ScopeRows]


class ScopeModels:
    """Each scope's answer head and calibration.

    Args:
        snapshot: a scope's key to its live entries.
        head_min_wordings: how many wordings an answer needs before a head learns it; None: no heads.
        bound: the error bound to calibrate for; None: no calibration.
        neighbors, checked: the cache's `neighbors` and `verify`, which calibration trials follow.
        min_entries: a scope with fewer live entries gets neither.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        head_min_wordings: int | None,
        bound: Bound | None,
        neighbors: int,
        checked: bool,
        min_entries: int,
        refit_share: float = 0.1,
    ) -> None:
        self._snapshot = snapshot
        self._head_min_wordings = head_min_wordings
        self._bound = bound
        self._neighbors = neighbors
        self._checked = checked
        self._min_entries = min_entries
        self._refit_share = refit_share
        self._models: dict[str, ScopeModel] = {}
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._worker: ThreadPoolExecutor | None = None

    def head(self, key: str) -> AnswerHead | None:
        with self._lock:
            model = self._models.get(key)
            return model.head if model is not None else None

    def calibration(self, key: str) -> Calibration | None:
        with self._lock:
            model = self._models.get(key)
            return model.calibration if model is not None else None

    def certified_scopes(self) -> int:
        """How many scopes' calibrations certified a point (serve by meaning)."""
        with self._lock:
            return sum(1 for m in self._models.values() if m.calibration is not None and m.calibration.point is not None)

    def changed(self, key: str, live_entries: int) -> None:
        """The scope now has `live_entries`: refit it in the background when it has drifted from its fit."""
        if live_entries < self._min_entries:
            with self._lock:
                self._models.pop(key, None)
            return
        with self._lock:
            model = self._models.get(key)
            if key in self._pending:
                return
            if model is not None and abs(live_entries - model.entries) < self._refit_share * model.entries:
                return
            self._pending.add(key)
            if self._worker is None:
                self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="answer-scopes")
            self._worker.submit(self._refit, key)

    def fit_now(self, keys: list[str]) -> None:
        """Wait for the background fits, then fit every scope in `keys` on its current entries."""
        with self._idle:
            self._idle.wait_for(lambda: not self._pending)
        for key in keys:
            self._fit(key)

    def clear(self) -> None:
        with self._lock:
            self._models.clear()

    def _refit(self, key: str) -> None:
        try:
            self._fit(key)
        finally:
            with self._idle:
                self._pending.discard(key)
                self._idle.notify_all()

    def _fit(self, key: str) -> None:
        rows = self._snapshot(key)
        if len(rows.answers) < self._min_entries:
            with self._lock:
                self._models.pop(key, None)
            return
        head = None
        if self._head_min_wordings is not None:
            head = fit_head(rows.vectors, rows.answers, self._head_min_wordings)
        model = ScopeModel(head, self._calibrate(rows), len(rows.answers))
        with self._lock:
            self._models[key] = model

    def _calibrate(self, rows: ScopeRows) -> Calibration | None:
        bound = self._bound
        if bound is None:
            return None
        if len(rows.answers) < min_evidence(bound.max_error_rate, bound.confidence):
            return calibrate([], bound.max_error_rate, bound.confidence)  # too few to certify anything
        trials = leave_one_out(
            rows.vectors, rows.answers, rows.questions, self._neighbors, self._head_min_wordings, self._checked
        )
        return calibrate(trials, bound.max_error_rate, bound.confidence)
