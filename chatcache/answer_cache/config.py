"""Answer-cache settings, checked at construction."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True)
class AnswerCacheConfig:
    """Attributes:
    max_error_rate: the share of answers served by meaning (not exact repeats) that may be
        wrong. When set, the cache chooses each scope's threshold, margin and head confidence
        itself: the loosest point of `decision.PATH` that the scope's own stored wordings
        certify at `bound_confidence` (`calibration.py`); a scope without that much evidence
        serves exact repeats only. `similarity_threshold`, `margin` and `head_confidence`'s
        value are then unused (None for `head_confidence` still turns heads off). Audits
        (`audit_rate`) watch the bound on live questions; with `audit_rate` 0 nothing does.
        None: the fixed thresholds below, with no bound.
    bound_confidence: how sure the bound is (the chance that a certified scope's error rate
        really is at most `max_error_rate`).
    similarity_threshold: cosine similarity a cached question needs to be served (0 is valid).
    intent_similarity_threshold: the same within a confirmed cacheable intent's scope, where
        the dialogue state machine already vouches for the meaning (by default any wording of
        the intent with the same slot values shares the entry; verification still applies).
    margin: how much closer the best answer must be than the closest different answer; a
        question between two answers gets neither.
    neighbors: how many nearest cached questions are weighed.
    head_confidence: where a scope holds at least `head_min_wordings` wordings of two answers
        or more, a classifier trained on them (its answer head, `heads.py`) chooses the answer
        instead of the neighbours' vote, and must be this sure (a probability); None leaves every
        choice to the vote. 0.8 was chosen on a split of BANKING77's training file.
    head_min_wordings: how many stored wordings an answer needs before the head learns it.
    max_entropy_bits: answers whose mean per-token entropy is above this are not stored. The
        design starts at 5.2 bits, which SmolLM2's answers never reach; 2.5 bits is about their
        median, and on GPTCache rewordings 56% of the answers under it stayed the same when
        the question was reworded against 26% above it (`bench/entropy_threshold.py`).
    ttl_s: lifetime of an entry; with `sliding_ttl` every hit restarts it.
    max_entries, max_bytes: capacity; beyond it the LFU+ policy evicts.
    verify: run the verification checks on every semantic match.
    audit_rate: share of hits for which the model runs anyway and the answers are compared.
    sync_interval_s: how stale this process's view of the answer table may get: a lookup first
        indexes the entries other processes (replicas on one database) stored, when the last
        look is older than this. 0 never looks (one process alone).
    """

    max_error_rate: float | None = None
    bound_confidence: float = 0.95
    similarity_threshold: float = 0.75
    intent_similarity_threshold: float = 0.0
    margin: float = 0.12
    neighbors: int = 10
    head_confidence: float | None = 0.8
    head_min_wordings: int = 5
    max_entropy_bits: float = 2.5
    ttl_s: float = 24 * 3600.0
    sliding_ttl: bool = False
    max_entries: int = 200_000
    max_bytes: int = 512 << 20
    verify: bool = True
    audit_rate: float = 0.0
    sync_interval_s: float = 0.5

    def __post_init__(self) -> None:
        if self.max_error_rate is not None and not 0.0 < self.max_error_rate < 0.5:
            raise ConfigError(f"max_error_rate is a share of served answers in (0, 0.5), got {self.max_error_rate}")
        if not 0.5 <= self.bound_confidence < 1.0:
            raise ConfigError(f"bound_confidence is a probability in [0.5, 1), got {self.bound_confidence}")
        for name in ("similarity_threshold", "intent_similarity_threshold"):
            value = getattr(self, name)
            if not -1.0 <= value <= 1.0:
                raise ConfigError(f"{name} is a cosine similarity in [-1, 1], got {value}")
        if not 0.0 <= self.margin <= 2.0:
            raise ConfigError(f"margin must be in [0, 2], got {self.margin}")
        if self.neighbors < 1 or self.max_entries < 1 or self.max_bytes < 1:
            raise ConfigError("neighbors, max_entries and max_bytes must be at least 1")
        if self.head_confidence is not None and not 0.0 < self.head_confidence <= 1.0:
            raise ConfigError(f"head_confidence is a probability in (0, 1] or None (no heads), got {self.head_confidence}")
        if self.head_min_wordings < 2:
            raise ConfigError(f"head_min_wordings must be at least 2, got {self.head_min_wordings}")
        if self.ttl_s <= 0:
            raise ConfigError(f"ttl_s must be positive, got {self.ttl_s}")
        if not 0.0 <= self.audit_rate <= 1.0:
            raise ConfigError(f"audit_rate must be in [0, 1], got {self.audit_rate}")
        if self.sync_interval_s < 0:
            raise ConfigError(f"sync_interval_s must be 0 (off) or positive, got {self.sync_interval_s}")
