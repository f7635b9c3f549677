"""`chatcache serve` under load: closed-loop HTTP clients on loopback against the engine alone.

SGD dev conversations behind a ~1,000-token system prompt, each a closed loop (it sends its next
user turn when its reply ends), on the bundled model. Side by side in one run:

1. in-process: N_low conversations at once in N_low threads on one `ChatEngine` (`stream`
   iterated to its end, which is what `chat` does), the caller timing the first piece;
2. HTTP, no SLO: the same conversations as N_low clients of a live `chatcache serve` app
   (uvicorn in a thread, a free port on 127.0.0.1), each with its own `httpx.Client`;
3. HTTP with `ttft_slo`: N_high clients. A client refused with 429 waits its `Retry-After`
   (at most `RETRY_CAP_S`) and sends the same turn again.

Clients stream (`"stream": true`): even-numbered ones post to `/v1/sessions/{id}/messages`
(the session created beforehand, untimed), odd-numbered ones to `/v1/chat/completions` with
`X-Session-Id` and the one new user message. TTFT is the client's, from sending the request to
the first content delta; the reply's tokens, the server's own TTFT and the admission control's
prediction come from the final chunk's `chatcache` field. A 429's latency is the time from
sending to its status line.

Every phase gets a fresh server or engine: a fresh data directory (`CHATCACHE_DATA_DIR`, so
spilled KV does not carry over) holding its own SQLite database. The server keeps its defaults
(answer cache and drift detection on), and the in-process engine is built with both on too,
so all phases do the same work per turn. The model is loaded once and shared (its scheduler's
measured rates carry over, as they would in a running server). The HTTP clients run in a
child process (spawned, one thread per client), so they share the machine's two cores with
the server, as a load generator on the same machine would, but not its GIL: the server's
event loop answers a 429 without waiting behind 32 client threads. Before the phases, an untimed in-process
warm-up runs one short turn of as many other conversations at once. After them, the turns two
phases share are compared: greedy decoding on the same history gives the same reply and drift
verdict, so a difference (listed with how often the turn was refused) is a finding.

Not measured here: API keys and rate limits (off), the non-streaming path, many tenants.

    python -m bench.serve_load [--data ../shared/data] [--quick] [--turns 4] [--max-new-tokens 64]
        [--clients-low 8] [--clients-high 32] [--slo 5.0] [--system-tokens 1000]

About 12 minutes on the 2-core machine (`--quick`: 8 and 16 clients, 2 turns of 32 tokens, 4 min).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import torch

from chatcache import ChatEngine, ChatModel, Message, TokenTierConfig, load_chat_model
from chatcache.serving import BackgroundServer, ServeSettings, create_app

from .common import BenchRun, bench_arguments, schema_system_prompt, sgd_user_turns
from .peer_protocol import percentile

RETRY_CAP_S = 3.0  # a refused client waits its Retry-After, but never longer than this
MAX_ATTEMPTS = 50  # a turn refused this often is given up (counted), so a run always ends
REJECTION_TARGET_MS = 50.0


@dataclass
class Served:
    """One answered request, as its client saw it."""

    ttft_s: float
    end_s: float
    generated_tokens: int
    tier: str | None
    answer_cache_hit: bool
    drift: bool
    server_ttft_s: float | None
    predicted_ttft_s: float | None
    text: str
    reused_tokens: int = 0  # prompt tokens the token tier served
    prefilled_tokens: int = 0
    replica: str | None = None  # behind `chatcache cluster`'s router, the replica that answered


@dataclass
class Rejected:
    """One 429: how long it took to arrive and what it asked for."""

    latency_s: float
    retry_after_s: float
    code: str | None


class ServeError(Exception):
    """A response that is neither an answer nor a 429 (recorded, and the conversation goes on)."""


Send = Callable[[str], Served | Rejected]
OpenSender = Callable[[int], AbstractContextManager[Send]]


@dataclass
class PhaseResult:
    turns: list[dict[str, Any]]
    rejections: list[dict[str, Any]]
    errors: list[str]
    wall_s: float


def drive(conversations: list[list[str]], open_sender: OpenSender) -> PhaseResult:
    """Every conversation in its own thread, all released together, each turn sent when the last ended."""
    turns: list[dict[str, Any]] = []
    rejections: list[dict[str, Any]] = []
    errors: list[str] = []
    lock = threading.Lock()
    clock = [0.0]  # when the clients were released, set as they are
    release = threading.Barrier(len(conversations) + 1, action=lambda: clock.__setitem__(0, time.perf_counter()))

    def run(index: int, texts: list[str]) -> None:
        try:
            with open_sender(index) as send:  # sessions are created here, before the clock starts
                release.wait()
                for turn, text in enumerate(texts):
                    converse(index, turn, text, send)
        except BaseException:
            release.abort()  # a client that cannot start stops the phase instead of hanging it
            raise

    def converse(index: int, turn: int, text: str, send: Send) -> None:
        for attempt in range(1, MAX_ATTEMPTS + 1):
            sent_at_s = round(time.perf_counter() - clock[0], 3)
            try:
                outcome = send(text)
            except Exception as error:  # noqa: BLE001 - recorded; the conversation goes on
                with lock:
                    errors.append(f"conversation {index} turn {turn}: {type(error).__name__}: {error}")
                return
            with lock:
                if isinstance(outcome, Served):
                    turns.append({"conversation": index, "turn": turn, "attempts": attempt, "sent_at_s": sent_at_s, **asdict(outcome)})
                    return
                rejections.append({"conversation": index, "turn": turn, "sent_at_s": sent_at_s, **asdict(outcome)})
            time.sleep(min(outcome.retry_after_s, RETRY_CAP_S))
        with lock:
            errors.append(f"conversation {index} turn {turn}: refused {MAX_ATTEMPTS} times")

    workers = [threading.Thread(target=run, args=(i, texts)) for i, texts in enumerate(conversations)]
    for worker in workers:
        worker.start()
    try:
        release.wait()
    except threading.BrokenBarrierError:
        for worker in workers:
            worker.join()
        raise RuntimeError("a client could not start (its error is printed above)") from None
    for worker in workers:
        worker.join()
    return PhaseResult(turns, rejections, errors, time.perf_counter() - clock[0])


# -- the two ways to send a turn ---------------------------------------------------------


def engine_sender(engine: ChatEngine, max_new_tokens: int) -> OpenSender:
    @contextmanager
    def open_sender(index: int) -> Iterator[Send]:
        def send(text: str) -> Served:
            sent = time.perf_counter()
            stream = engine.stream(f"load-{index}", text, max_new_tokens=max_new_tokens)
            first: float | None = None
            for piece in stream:
                if piece and first is None:
                    first = time.perf_counter() - sent
            end = time.perf_counter() - sent
            reply = stream.reply
            assert reply is not None
            stats = reply.stats
            return Served(
                first or end, end, stats.generated_tokens, stats.tier, stats.answer_cache_hit, stats.drift, stats.ttft_s, None,
                reply.text, stats.reused_tokens, stats.prefilled_tokens,
            )  # fmt: skip

        yield send

    return open_sender


def http_sender(url: str, max_new_tokens: int) -> OpenSender:
    @contextmanager
    def open_sender(index: int) -> Iterator[Send]:
        session = f"load-{index}"
        with httpx.Client(base_url=url, timeout=httpx.Timeout(600.0, connect=10.0)) as client:
            if index % 2 == 0:
                client.post("/v1/sessions", json={"id": session}).raise_for_status()
                path, headers = f"/v1/sessions/{session}/messages", {}

                def body(text: str) -> dict[str, Any]:
                    return {"content": text, "max_tokens": max_new_tokens, "stream": True}
            else:
                path, headers = "/v1/chat/completions", {"X-Session-Id": session}

                def body(text: str) -> dict[str, Any]:
                    message = {"role": "user", "content": text}
                    return {"model": "bundled", "messages": [message], "max_tokens": max_new_tokens, "stream": True}

            yield lambda text: post_streaming(client, path, headers, body(text))

    return open_sender


def post_streaming(client: httpx.Client, path: str, headers: dict[str, str], body: dict[str, Any]) -> Served | Rejected:
    """POST one streaming turn and read its server-sent events to `[DONE]`."""
    sent = time.perf_counter()
    with client.stream("POST", path, json=body, headers=headers) as response:
        status_s = time.perf_counter() - sent
        if response.status_code == 429:
            response.read()
            code = response.json().get("error", {}).get("code")
            return Rejected(status_s, float(response.headers.get("Retry-After", "1")), code)
        if response.status_code != 200:
            response.read()
            raise ServeError(f"HTTP {response.status_code}: {response.text[:200]}")
        first: float | None = None
        pieces: list[str] = []
        final: dict[str, Any] = {}
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                break
            event = json.loads(line.removeprefix("data: "))
            if "error" in event:
                raise ServeError(f"in the stream: {event['error'].get('message')}")
            if "chatcache" in event:
                final = event["chatcache"]
            elif event.get("choices") and (piece := event["choices"][0]["delta"].get("content")):
                first = first or time.perf_counter() - sent
                pieces.append(piece)
        end = time.perf_counter() - sent
    if not final:
        raise ServeError("the stream ended without its final chunk")
    return Served(
        first or end, end, final["generated_tokens"], final["tier"], final["answer_cache_hit"], bool(final["drift"]),
        final["ttft_s"], final["predicted_ttft_s"], "".join(pieces), final["reused_tokens"], final["prefilled_tokens"],
        response.headers.get("x-chatcache-replica"),
    )  # fmt: skip


# -- a fresh server or engine per phase ----------------------------------------------------


@contextmanager
def fresh_data_dir() -> Iterator[Path]:
    """A temporary `CHATCACHE_DATA_DIR` (spilled KV, the database) for one phase."""
    previous = os.environ.get("CHATCACHE_DATA_DIR")
    with tempfile.TemporaryDirectory(prefix="serve-load-") as scratch:
        os.environ["CHATCACHE_DATA_DIR"] = scratch
        try:
            yield Path(scratch)
        finally:
            if previous is None:
                os.environ.pop("CHATCACHE_DATA_DIR", None)
            else:
                os.environ["CHATCACHE_DATA_DIR"] = previous


@contextmanager
def live_server(settings: ServeSettings, chat_model: ChatModel) -> Iterator[str]:
    """`chatcache serve` in a thread on a free loopback port, started (model warmed up), then stopped."""
    with BackgroundServer(create_app(settings, chat_model=chat_model)) as server:
        yield server.url


def in_process(chat_model: ChatModel, system_prompt: str, conversations: list[list[str]], max_new_tokens: int) -> PhaseResult:
    with fresh_data_dir() as data_dir:
        engine = ChatEngine(
            chat_model, system_prompt=system_prompt, answer_cache=True, drift=True,
            token_tier=TokenTierConfig(spill_dir=data_dir / "kv"), store=f"sqlite:///{data_dir}/sessions.db",
        )  # fmt: skip
        try:  # the server's own warm-up: the system prompt's KV, and the scheduler's rates
            for _ in engine.complete([Message("user", "Hello")], kv_key="warm-up", max_new_tokens=4):
                pass
            engine.token_tier.drop("warm-up")
            return drive(conversations, engine_sender(engine, max_new_tokens))
        finally:
            engine.close()


def over_http(
    chat_model: ChatModel, system_prompt: str, conversations: list[list[str]], max_new_tokens: int, slo: float | None
) -> PhaseResult:
    with fresh_data_dir() as data_dir:
        settings = ServeSettings.load(system_prompt=system_prompt, ttft_slo=slo, db=f"sqlite:///{data_dir}/sessions.db")
        with live_server(settings, chat_model) as url, ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as clients:
            return clients.submit(drive_over_http, url, conversations, max_new_tokens).result()


def drive_over_http(url: str, conversations: list[list[str]], max_new_tokens: int) -> PhaseResult:
    """The HTTP clients, run in a child process: their threads hold its GIL, not the server's."""
    return drive(conversations, http_sender(url, max_new_tokens))


# -- figures -------------------------------------------------------------------------------


def ms(values: Sequence[float], q: float) -> float:
    return round(percentile([v * 1000 for v in values], q), 1)


def count_by(rows: list[dict[str, Any]], key: str) -> dict[str, int]:
    values = [str(row[key]) for row in rows]
    return {value: values.count(value) for value in sorted(set(values))}


def figures(result: PhaseResult, peak_batch: int, http: bool) -> dict[str, Any]:
    turns = result.turns
    tokens = sum(t["generated_tokens"] for t in turns)
    ttft = [t["ttft_s"] for t in turns]
    predicted = [t for t in turns if t["predicted_ttft_s"] is not None]
    errors = [t["ttft_s"] - t["predicted_ttft_s"] for t in predicted]
    overhead = [t["ttft_s"] - t["server_ttft_s"] for t in turns if t["server_ttft_s"] is not None]
    rejected = [r["latency_s"] for r in result.rejections]
    row: dict[str, Any] = {
        "conversations": len({t["conversation"] for t in turns}),
        "turns": len(turns),
        "generated_tokens": tokens,
        "wall_s": round(result.wall_s, 2),
        "tokens_per_s": round(tokens / result.wall_s, 2),
        "ttft_p50_ms": ms(ttft, 50),
        "ttft_p99_ms": ms(ttft, 99),
        "ttft_max_ms": ms(ttft, 100),
        "client_minus_server_ttft_p50_ms": ms(overhead, 50),  # what HTTP adds before the first token
        "answer_cache_hits": sum(bool(t["answer_cache_hit"]) for t in turns),
        "drift_turns": sum(t["drift"] for t in turns),
        "tiers": count_by(turns, "tier"),
        "peak_batch": peak_batch,
        "errors": result.errors,
    }
    if predicted:
        row["predictor"] = {
            "turns": len(predicted),
            "abs_error_p50_s": round(percentile([abs(e) for e in errors], 50), 3),
            "mean_signed_error_s": round(sum(errors) / len(errors), 3),  # > 0: the first token came later than predicted
            "worst": [
                {k: t[k] for k in ("conversation", "turn", "attempts", "sent_at_s", "predicted_ttft_s", "server_ttft_s", "tier")}
                | {"client_ttft_s": round(t["ttft_s"], 3)}
                for t in sorted(predicted, key=lambda t: -abs(t["ttft_s"] - t["predicted_ttft_s"]))[:5]
            ],
        }
    if http:
        row["by_endpoint"] = {  # even-numbered clients use the sessions API
            name: {"turns": len(some), "ttft_p50_ms": ms([t["ttft_s"] for t in some], 50)}
            for name, parity in (("sessions", 0), ("chat_completions", 1))
            if (some := [t for t in turns if t["conversation"] % 2 == parity])
        }
        row["rejections"] = {
            "count": len(rejected),
            "turns_refused_at_least_once": sum(t["attempts"] > 1 for t in turns),
            "codes": count_by(result.rejections, "code"),
            "retry_after_s": sorted({r["retry_after_s"] for r in result.rejections}),
            "latency_p50_ms": ms(rejected, 50),
            "latency_p99_ms": ms(rejected, 99),
            "latency_max_ms": ms(rejected, 100),
            "over_target": sum(latency * 1000 >= REJECTION_TARGET_MS for latency in rejected),
        }
    return row


def agreement(reference: PhaseResult, other: PhaseResult) -> dict[str, Any]:
    """The turns both phases answered: same reply text, same drift verdict? (Greedy decoding on the
    same history gives the same reply; a difference is listed with how often `other` was refused.)"""
    answered = {(t["conversation"], t["turn"]): t for t in reference.turns}
    pairs = [(answered[key], t) for t in other.turns if (key := (t["conversation"], t["turn"])) in answered]
    differing = [
        {"conversation": b["conversation"], "turn": b["turn"], "attempts": b["attempts"], "drift": [a["drift"], b["drift"]]}
        for a, b in pairs
        if a["text"] != b["text"] or a["drift"] != b["drift"]
    ]
    return {
        "turns_compared": len(pairs),
        "same_reply": sum(a["text"] == b["text"] for a, b in pairs),
        "same_drift": sum(a["drift"] == b["drift"] for a, b in pairs),
        "differing": differing[:20],
    }


def plot(phases: dict[str, PhaseResult], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, middle, right) = plt.subplots(1, 3, figsize=(15, 4.2))
    for number, (label, result) in enumerate(phases.items()):
        ttft = sorted(t["ttft_s"] for t in result.turns)
        left.step(ttft, [(i + 1) / len(ttft) for i in range(len(ttft))], where="post", color=f"C{number}", label=label)
        predicted = [t for t in result.turns if t["predicted_ttft_s"] is not None]
        if predicted:
            right.scatter([t["predicted_ttft_s"] for t in predicted], [t["ttft_s"] for t in predicted], s=10, color=f"C{number}", label=label)
    left.set_xscale("log")
    left.set_xlabel("client TTFT (s)")
    left.set_ylabel("share of turns")
    left.legend(fontsize=8)
    rejected = [r["latency_s"] * 1000 for result in phases.values() for r in result.rejections]
    if rejected:
        middle.hist(rejected, bins=30)
        middle.axvline(REJECTION_TARGET_MS, color="red", linestyle="--", label=f"target {REJECTION_TARGET_MS:g} ms")
        middle.legend(fontsize=8)
    else:
        middle.text(0.5, 0.5, "no 429", ha="center", va="center", transform=middle.transAxes)
    middle.set_xlabel("time for a 429 to arrive (ms)")
    middle.set_ylabel("429 responses")
    top = max([t["ttft_s"] for result in phases.values() for t in result.turns] + [1.0])
    right.plot([0, top], [0, top], "k:", label="predicted = actual")
    right.set_xlabel("predicted TTFT (s)")
    right.set_ylabel("client TTFT (s)")
    right.legend(fontsize=8)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def parse_options(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The options, with the quick defaults filled in where none was given."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--turns", type=int, default=None, help="user turns per conversation (default 4, quick 2)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="reply length (default 64, quick 32)")
    parser.add_argument("--clients-low", type=int, default=8, help="clients without an SLO, and the in-process threads (default 8)")
    parser.add_argument("--clients-high", type=int, default=None, help="clients under the SLO (default 32, quick 16)")
    parser.add_argument("--slo", type=float, default=5.0, help="the server's ttft_slo in seconds for the last phase (default 5.0)")
    parser.add_argument("--system-tokens", type=int, default=1000, help="system prompt length in tokens (default 1000)")
    args = parser.parse_args(argv)
    args.turns = args.turns or (2 if args.quick else 4)
    args.max_new_tokens = args.max_new_tokens or (32 if args.quick else 64)
    args.clients_high = args.clients_high or (16 if args.quick else 32)
    if min(args.turns, args.max_new_tokens, args.clients_low, args.clients_high) < 1 or args.slo <= 0:
        parser.error("--turns, --max-new-tokens and the client counts must be at least 1, --slo above 0")
    return args


def main() -> None:
    args = parse_options()
    run = BenchRun("serve_load", args, minutes=(12, 4))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    chat_model = load_chat_model("bundled", device="cpu")  # before any data dir is swapped: its converted weights live there
    system_prompt = schema_system_prompt(args.data, chat_model.tokenizer, target_tokens=args.system_tokens)
    count = max(args.clients_low, args.clients_high)
    dialogues = [turns[: args.turns] for _, turns in sgd_user_turns(args.data, count + args.clients_low, min_turns=args.turns)]
    dialogues, warm_up = dialogues[:count], [turns[:1] for turns in dialogues[count:]]
    if len(dialogues) < count:
        raise SystemExit(f"only {len(dialogues)} SGD dev dialogues have {args.turns} user turns")
    run.section("setup", {
        "model": "bundled (SmolLM2-135M-Instruct, float32, CPU)",
        "torch_threads": torch.get_num_threads(),
        "system_prompt_tokens": len(chat_model.tokenizer.encode(system_prompt, add_special_tokens=False)),
        "server": "answer cache and drift on (the defaults); the in-process engine the same",
        "retry_cap_s": RETRY_CAP_S,
    })  # fmt: skip
    scheduler = chat_model.scheduler
    # Untimed: the first batched decodes of a process pay one-time costs (allocations, kernel
    # choices) that would otherwise fall on whichever phase runs first.
    run.section("warm_up", figures(in_process(chat_model, system_prompt, warm_up, 16), scheduler.peak_running, http=False))
    low, high = dialogues[: args.clients_low], dialogues[: args.clients_high]
    phases: dict[str, PhaseResult] = {}
    rows: dict[str, dict[str, Any]] = {}
    plan: list[tuple[str, str, Callable[[], PhaseResult]]] = [
        ("in_process", f"in-process, {len(low)} threads", partial(in_process, chat_model, system_prompt, low, args.max_new_tokens)),
        ("http", f"HTTP, {len(low)} clients, no SLO", partial(over_http, chat_model, system_prompt, low, args.max_new_tokens, None)),
        ("http_slo", f"HTTP, {len(high)} clients, SLO {args.slo:g} s", partial(over_http, chat_model, system_prompt, high, args.max_new_tokens, args.slo)),
    ]
    for key, label, measure in plan:
        scheduler.peak_running = 0  # the most requests decoded together, this phase
        phases[label] = measure()
        rows[key] = figures(phases[label], scheduler.peak_running, http=key != "in_process")
        run.section(key, rows[key])
    by_key = {key: phases[label] for key, label, _ in plan}
    run.section("agreement", {
        "http_vs_in_process": agreement(by_key["in_process"], by_key["http"]),
        "http_slo_vs_http": agreement(by_key["http"], by_key["http_slo"]),
    })  # fmt: skip
    plot_path = Path(args.out) / "serve_load.png"
    plot(phases, plot_path, f"SmolLM2-135M on CPU behind chatcache serve, {args.turns} turns x {args.max_new_tokens} tokens, closed loop")
    slo_row, rejections = rows["http_slo"], rows["http_slo"].get("rejections", {})
    run.finish(
        plot=str(plot_path),
        http_to_in_process=round(rows["http"]["tokens_per_s"] / rows["in_process"]["tokens_per_s"], 3),
        http_ttft_p50_to_in_process=round(rows["http"]["ttft_p50_ms"] / rows["in_process"]["ttft_p50_ms"], 2),
        slo_ttft_p99_s=round(slo_row["ttft_p99_ms"] / 1000, 3),
        slo_rejections=rejections.get("count", 0),
        slo_rejection_latency_max_ms=rejections.get("latency_max_ms", 0.0),
        slo_predictor_abs_error_p50_s=slo_row.get("predictor", {}).get("abs_error_p50_s"),
        slo_predictor_mean_signed_error_s=slo_row.get("predictor", {}).get("mean_signed_error_s"),
        targets={
            "http_to_in_process": ">= 0.90",
            "slo_ttft_p99_s": f"< {args.slo:g}",
            "slo_rejection_latency_max_ms": f"< {REJECTION_TARGET_MS:g} (every 429)",
        },
    )


if __name__ == "__main__":
    main()
