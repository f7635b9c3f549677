"""The server's Prometheus metrics, named as vLLM's under a `chatcache:` prefix, plus our tiers'.

Per-request figures are observed as each turn ends (`observe_turn`); what the model worker,
the token tier and the answer caches hold is read when Prometheus scrapes (`_State`), so a
gauge is never stale and a counter kept elsewhere is never counted twice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from chatcache import Scheduler, TokenTier

from ..engine import ChatEngine
from ..reply import Reply

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TOKEN_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5)
ERROR_BUCKETS = (-5.0, -2.0, -1.0, -0.5, -0.25, -0.1, 0.0, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0)


class ServerMetrics:
    """Every metric of one server, in its own registry (a test may run several servers)."""

    def __init__(
        self,
        scheduler: Scheduler,
        token_tier: TokenTier,
        engines: Callable[[], list[ChatEngine]],
        admitted_waiting: Callable[[], int],
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram("chatcache:time_to_first_token_seconds", "Time to first token.", buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("chatcache:e2e_request_latency_seconds", "Request latency, arrival to last token.", buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("chatcache:inter_token_latency_seconds", "Time between a reply's tokens.", buckets=TOKEN_BUCKETS, registry=r)
        self.prefix_queries = Counter("chatcache:prefix_cache_queries", "Prompt tokens looked up in the token tier.", registry=r)
        self.prefix_hits = Counter("chatcache:prefix_cache_hits", "Prompt tokens served from the token tier.", registry=r)
        self.prompt_tokens = Counter("chatcache:prompt_tokens", "Prompt tokens of model turns.", registry=r)
        self.generation_tokens = Counter("chatcache:generation_tokens", "Tokens generated.", registry=r)
        self.draft_tokens = Counter("chatcache:spec_decode_num_draft_tokens", "Tokens drafted for free and checked by the model.", registry=r)
        self.accepted_tokens = Counter("chatcache:spec_decode_num_accepted_tokens", "Drafted tokens the model wrote itself.", registry=r)
        self.requests = Counter("chatcache:request_success", "Finished turns by how they finished.", ["finish_reason"], registry=r)
        self.served_by = Counter("chatcache:turns_served", "Finished turns by the tier that answered.", ["tier"], registry=r)
        self.drift = Counter("chatcache:drift_events", "Turns detected as a topic change.", registry=r)
        self.drift_undone = Counter("chatcache:drift_resets_undone", "Turns that went back to the topic the last drift dropped.", registry=r)
        self.promotions = Counter("chatcache:promotions", "Turns whose confirmed intent became session facts.", registry=r)
        self.rejections = Counter("chatcache:rejections", "Requests refused, by reason.", ["reason"], registry=r)
        self.prediction_error = Histogram(
            "chatcache:ttft_prediction_error_seconds", "Actual minus predicted time to first token of admitted requests.",
            buckets=ERROR_BUCKETS, registry=r,
        )  # fmt: skip
        r.register(_State(scheduler, token_tier, engines, admitted_waiting))

    def observe_turn(self, reply: Reply, e2e_s: float, prediction_error_s: float | None) -> None:
        stats = reply.stats
        self.ttft.observe(stats.ttft_s)
        self.e2e.observe(e2e_s)
        self.requests.labels(stats.finish_reason).inc()
        self.served_by.labels(stats.tier).inc()
        self.drift.inc(stats.drift)
        self.drift_undone.inc(stats.drift_undone)
        self.promotions.inc(stats.promoted)
        if prediction_error_s is not None:
            self.prediction_error.observe(prediction_error_s)
        if stats.answer_cache_hit or stats.tier == "dialog":
            return  # the model did not run
        self.prefix_queries.inc(stats.prompt_tokens)
        self.prefix_hits.inc(stats.reused_tokens)
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.generation_tokens.inc(stats.generated_tokens)
        self.draft_tokens.inc(stats.drafted_tokens)
        self.accepted_tokens.inc(stats.accepted_tokens)
        if stats.decode_tokens_per_s > 0:
            gap = 1 / stats.decode_tokens_per_s
            for _ in range(stats.generated_tokens - 1):
                self.itl.observe(gap)


def _bound(engines: list[ChatEngine]) -> Iterator[GaugeMetricFamily]:
    """The answer cache's error bound and the audits' estimate, when a bound is set.

    Every engine counts the audits of the whole database (every tenant's, every replica's), so
    the gauges are the same on each replica, up to how recently it read the table: the engine
    that has counted the most is the freshest. Across replicas take the max, not the sum.
    """
    known = [bound for engine in engines if (bound := engine.answer_cache_bound()) is not None]
    if not known:
        return
    bound = max(known, key=lambda b: b.audits)
    assert bound.max_error_rate is not None  # `answer_cache_bound` gives None without one
    low, high = bound.interval
    estimate = math.nan if bound.estimate is None else bound.estimate  # no audit yet: no value
    yield GaugeMetricFamily("chatcache:answer_cache_max_error_rate", "The share of answers served by meaning that may be wrong.", value=bound.max_error_rate)
    yield GaugeMetricFamily("chatcache:answer_cache_audit_error_rate", "Audited cached answers the model answered otherwise, over all audits.", value=estimate)
    yield GaugeMetricFamily("chatcache:answer_cache_audit_error_rate_lower", "Low end of the audit error rate's exact interval.", value=low)
    yield GaugeMetricFamily("chatcache:answer_cache_audit_error_rate_upper", "High end of the audit error rate's exact interval.", value=high)
    yield GaugeMetricFamily("chatcache:answer_cache_scopes_by_meaning", "Scopes whose calibration lets them serve by meaning.", value=bound.scopes_by_meaning)
    yield GaugeMetricFamily("chatcache:answer_cache_scopes_exact_only", "Calibrated scopes that serve exact repeats only.", value=bound.scopes_exact_only)


class _State(Collector):
    """Read at scrape time: the worker's queue, the token tier's memory and counters, the answer and tool-result caches."""

    def __init__(
        self,
        scheduler: Scheduler,
        token_tier: TokenTier,
        engines: Callable[[], list[ChatEngine]],
        admitted_waiting: Callable[[], int],
    ) -> None:
        self.scheduler = scheduler
        self.token_tier = token_tier
        self.engines = engines
        self.admitted_waiting = admitted_waiting

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily("chatcache:num_requests_running", "Requests decoding now.", value=self.scheduler.running)
        yield GaugeMetricFamily(
            "chatcache:num_requests_waiting", "Requests waiting for their first token.",
            value=max(self.scheduler.waiting, self.admitted_waiting()),
        )  # fmt: skip
        kv = self.token_tier.stats()
        yield GaugeMetricFamily("chatcache:kv_cache_usage_perc", "Token-tier KV in memory over its budget (0 to 1).", value=kv.resident_bytes / max(1, kv.budget_bytes))
        yield GaugeMetricFamily("chatcache:kv_cache_resident_bytes", "Token-tier KV bytes in memory.", value=kv.resident_bytes)
        for name, value, what in (
            ("kv_spills", kv.spills, "Sessions' KV written to disk."),
            ("kv_restores", kv.restores, "Sessions' KV read back from disk."),
            ("kv_evictions", kv.evictions, "Sessions' KV let go of to stay within the budget."),
            ("kv_failed_restores", kv.failed_restores, "Spilled KV files that could not be trusted."),
        ):
            yield CounterMetricFamily(f"chatcache:{name}", what, value=value)
        engines = self.engines()
        lookups = hits = stores = audits = audit_errors = 0
        for engine in engines:
            if engine.answer_cache is not None:
                stats = engine.answer_cache.stats
                lookups, hits, stores = lookups + stats.lookups, hits + stats.hits, stores + stats.stores
                audits, audit_errors = audits + stats.audits, audit_errors + stats.audit_errors
        yield CounterMetricFamily("chatcache:answer_cache_lookups", "Answer-cache lookups.", value=lookups)
        yield CounterMetricFamily("chatcache:answer_cache_hits", "Answers served from the answer cache.", value=hits)
        yield CounterMetricFamily("chatcache:answer_cache_stores", "Answers kept in the answer cache.", value=stores)
        yield CounterMetricFamily("chatcache:answer_cache_audits", "Cached answers this server had the model answer again.", value=audits)
        yield CounterMetricFamily(
            "chatcache:answer_cache_audit_errors", "Audited cached answers the model answered otherwise.", value=audit_errors
        )
        yield from _bound(engines)
        results = [engine.actions.results.stats for engine in engines if engine.actions is not None]
        yield CounterMetricFamily("chatcache:tool_result_cache_hits", "Action results served from the tool-result cache.", value=sum(r.hits for r in results))
        yield CounterMetricFamily(
            "chatcache:tool_result_cache_misses", "Cacheable action results not kept (the action ran).", value=sum(r.misses for r in results)
        )
        yield CounterMetricFamily(
            "chatcache:tool_result_cache_invalidations", "Kept action results dropped by an action that changed them.",
            value=sum(r.invalidated for r in results),
        )  # fmt: skip
