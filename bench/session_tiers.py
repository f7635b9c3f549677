"""Per-turn cost of the session tier, turn tier, dialogue state machine and drift detection.

Everything a turn does around the chat model, measured with 10,000 sessions in the SQLite
database: open the conversation, take the session's turn lease, record the user message, classify and step the dialogue
state machine (state saved with optimistic locking), detect drift, update the turn tier,
record the reply, release the lease. The turns and replies are SGD dev's. Embeddings are computed beforehand for
the main figure (the embedder is a model too); the MiniLM embedding of one turn (the user turn
with the assistant's last turn, one batch, as the coordinator embeds them) is timed beside it.

    python -m bench.session_tiers [--data ../shared/data] [--sessions 10000] [--turns 300] [--quick]

About 3 minutes on 2 CPU cores, most of it seeding the database; --quick (1,000 sessions,
100 turns) under a minute. Results are written to bench/out/session_tiers.json as each
section finishes.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time

import numpy as np

from chatcache.config import MemoryConfig
from chatcache.engine.memory import ResidentSessions
from chatcache.tiers.conversations import Conversations
from chatcache.steering.drift import DriftConfig
from chatcache.steering.hcac import ContextCoordinator, sentence_embed
from chatcache.model.loading import load_embedder
from chatcache.model.prompt import Message
from chatcache.tiers.turn_tier import TurnTierConfig
from chatcache.dialog import load_bot
from chatcache.storage import SessionStore

from .common import BenchRun, bench_arguments, sgd_exchanges


SEED_TURN = ("What are your opening hours?", "We open at 9.")


def seed_sessions(store: SessionStore, count: int) -> None:
    for index in range(count):
        store.create_session(f"seed-{index}", "bench", "customer_service")
        store.append_message(f"seed-{index}", "user", SEED_TURN[0], 7)
        store.append_message(f"seed-{index}", "assistant", SEED_TURN[1], 5)


def percentile(values: list[float], q: float) -> float:
    return float(np.percentile(np.array(values), q))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_arguments(parser)
    parser.add_argument("--sessions", type=int, default=None, help="sessions in the database (default 10,000, quick 1,000)")
    parser.add_argument("--turns", type=int, default=None, help="timed turns (default 300, quick 100)")
    args = parser.parse_args()
    args.sessions = args.sessions or (1_000 if args.quick else 10_000)
    args.turns = args.turns or (100 if args.quick else 300)
    run = BenchRun("session_tiers", args, minutes=(3, 1))

    bot = load_bot("customer_service")
    model_embed = sentence_embed(load_embedder("bundled", device="cpu"))
    dialogues = sgd_exchanges(args.data, dialogues=max(1, args.turns // 10), min_turns=10)
    exchanges = [pair for pairs in dialogues for pair in pairs[:10]][: args.turns]
    texts = list({text for pair in exchanges for text in pair})
    texts += [e for intent in bot.intents for e in intent.examples] + list(SEED_TURN)
    vectors = dict(zip(texts, model_embed(texts)))

    embedded_during_turns = []  # texts only a turn makes (a follow-up re-read after its previous message)

    def precomputed(batch: list[str]) -> np.ndarray:
        missing = [text for text in batch if text not in vectors]
        if missing:
            embedded_during_turns.extend(missing)
            vectors.update(zip(missing, model_embed(missing)))
        return np.stack([vectors[text] for text in batch])

    embed_ms = []
    for (user, _), (_, previous_reply) in zip(exchanges[1:101], exchanges):
        started = time.perf_counter()
        model_embed([user, previous_reply])
        embed_ms.append((time.perf_counter() - started) * 1000)
    run.section("minilm_embed_turn_and_reply_ms", {"p50": percentile(embed_ms, 50), "p95": percentile(embed_ms, 95)})

    with tempfile.TemporaryDirectory() as scratch:
        store = SessionStore.open(scratch)
        seeding_started = time.perf_counter()
        seed_sessions(store, args.sessions)
        run.section("seeding_s", time.perf_counter() - seeding_started)
        conversations = Conversations(store, "customer_service", "bench", bot.system_prompt)
        coordinator = ContextCoordinator(conversations, precomputed, bot, DriftConfig())
        resident = ResidentSessions(MemoryConfig(), conversations, TurnTierConfig(), None, store.expire_sessions)
        rng = random.Random(0)
        turn_ms = []
        for index, (text, reply) in enumerate(exchanges):
            session_id = f"live-{index // 10}" if rng.random() < 0.8 else f"seed-{rng.randrange(args.sessions)}"
            started = time.perf_counter()
            with resident.hold(session_id, create=True) as memory, conversations.turn(memory.conversation):
                conversation = memory.conversation
                user_seq = conversations.record_user(conversation, text, len(text.split()))
                turn_id = f"{session_id}:{user_seq}"
                context = coordinator.before_reply(memory, text, turn_id)
                coordinator.after_reply(conversation, context, turn_id)
                conversations.commit(conversation, Message("user", text), user_seq, Message("assistant", reply), {"tier": "bench"})
            turn_ms.append((time.perf_counter() - started) * 1000)
        sessions_in_db = store.count_sessions()
        store.close()

    p50 = percentile(turn_ms, 50)
    run.section("per_turn_ms", {"p50": p50, "p95": percentile(turn_ms, 95), "p99": percentile(turn_ms, 99)})
    run.finish(
        sessions_in_db=sessions_in_db, turns=len(turn_ms), texts_embedded_during_turns=len(embedded_during_turns),
        target_p50_ms=10.0, meets_target=p50 <= 10.0,
    )  # fmt: skip

if __name__ == "__main__":
    main()
