"""No user is ever served an answer that depends on another user's data.

The scope rules on the tiny model (fast, exact), then the reported leak on the real model
through the engine, LangChain and the CLI, and a randomized sweep of sessions that share
their middle exchange but not their secrets.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage

from chatcache import TokenTierConfig
from chatcache.answer_cache import AnswerCacheConfig, Scope, carries_personal_data
from chatcache.answer_cache.answering import answer_scope
from chatcache.cli import main
from chatcache.tiers.conversations import Conversation
from chatcache.steering.hcac import TurnContext
from chatcache.langchain import CachedChatModel
from chatcache.model.prompt import Message

SYSTEM = "You are a helpful assistant."
STORE_ALL = AnswerCacheConfig(max_entropy_bits=100.0)
BASE = Scope("model", "bot")  # the scope every answer of one engine shares


@pytest.mark.parametrize(
    "text",
    [
        "My name is Alice Smith and my account number is 12345674.",
        "my account number: 87654323",
        "I'm Bob, nice to meet you",
        "Call me Ishmael.",
        "write to me at bob.jones@example.org",
        "My phone is 555-0100",
        "card 4111 1111 1111 1111",
        "My password is swordfish",
        "I live in Springfield",
    ],
)
def test_personal_data_is_recognised(text: str) -> None:
    assert carries_personal_data(text)


@pytest.mark.parametrize(
    "text",
    ["Count from 1 to 5.", "What is my account number?", "What are your opening hours?", "How do I reset my PIN?", "What is 12 times 13?"],
)
def test_questions_without_a_value_are_not_personal(text: str) -> None:
    assert not carries_personal_data(text)


def _conversation(session_id: str, *texts: str) -> Conversation:
    """A conversation whose turns alternate user and assistant texts, as the engine holds it."""
    roles = ("user", "assistant")
    turns = [Message(roles[i % 2], text) for i, text in enumerate(texts)]
    return Conversation(session_id, system=Message("system", SYSTEM), turns=turns)


def test_a_follow_up_is_scoped_by_the_whole_conversation_not_the_last_exchange() -> None:
    count = ("Count from 1 to 5.", "1, 2, 3, 4, 5.")
    paris = _conversation("a", "Tell me about Paris.", "Paris is the capital of France.", *count)
    rome = _conversation("b", "Tell me about Rome.", "Rome is the capital of Italy.", *count)
    question = "Which city did I ask about?"
    a, b = (answer_scope(BASE, "local", c, TurnContext(), question) for c in (paris, rome))
    assert a is not None and b is not None and a.scope != b.scope  # the same last exchange, not the same context
    same = answer_scope(BASE, "local", _conversation("c", *[m.content for m in paris.turns]), TurnContext(), question)
    assert same == a  # word for word the same conversation: the model sees the same prompt
    moved = _conversation("d", *[m.content for m in paris.turns])
    moved.context_start = 2  # the Paris turn left the prompt (drift): the model no longer sees it
    assert answer_scope(BASE, "local", moved, TurnContext(), question) != a
    elsewhere = answer_scope(BASE, "someone-else", paris, TurnContext(), question)
    assert elsewhere is not None and elsewhere.scope != a.scope  # follow-ups are never shared across users
    assert not a.across_users


def test_an_engine_scopes_a_follow_up_by_its_user(tiny_model, make_engine, toy_embed) -> None:  # type: ignore[no-untyped-def]
    """The same conversation (the model answers both alike), the same follow-up: one scope each user."""
    engines = [make_engine(tiny_model, system_prompt=SYSTEM, answer_cache=True, embedder=toy_embed, user_id=user) for user in ("local", "someone-else")]
    question = "Which city did I ask about?"
    for engine, session in zip(engines, ("a", "b")):
        engine.chat(session, "Tell me about Paris.", max_new_tokens=4)
    mine, elsewhere = (engine.turns.answer_scope(session, question) for engine, session in zip(engines, ("a", "b")))
    assert engines[0].sessions.history("a") == engines[1].sessions.history("b")
    assert mine is not None and elsewhere is not None and mine.scope != elsewhere.scope and not mine.across_users
    uncached = make_engine(tiny_model, system_prompt=SYSTEM)
    uncached.sessions.create("a")
    assert uncached.turns.answer_scope("a", question) is None  # no answer cache: nothing is looked up


def test_a_turn_whose_context_or_question_carries_personal_data_is_not_cached(tiny_model, make_engine, toy_embed) -> None:  # type: ignore[no-untyped-def]
    engine = make_engine(tiny_model, system_prompt=SYSTEM, answer_cache=True, embedder=toy_embed)
    first = answer_scope(BASE, "local", _conversation("first"), TurnContext(), "What are your opening hours?")
    assert first is not None and first.scope == BASE and first.across_users  # context-free: shared
    assert answer_scope(BASE, "local", _conversation("first"), TurnContext(), "Is account 12345674 still open?") is None
    alice = _conversation("alice", "My account number is 12345674.", "Noted.")
    assert answer_scope(BASE, "local", alice, TurnContext(), "What is my account number?") is None
    engine.chat("alice", "My account number is 12345674.", max_new_tokens=4)
    engine.chat("alice", "What is my account number?", max_new_tokens=4)
    assert engine.answer_cache.snapshot().lookups == 0  # neither turn reached the cache


@pytest.fixture
def bundled_engine(make_engine, bundled_model, tmp_path: Path):  # type: ignore[no-untyped-def]
    def build(**kwargs):  # type: ignore[no-untyped-def]
        kwargs.setdefault("store", f"sqlite:///{tmp_path}/shared.db")
        kwargs.setdefault("token_tier", TokenTierConfig(spill_dir=None))
        kwargs.setdefault("answer_cache", STORE_ALL)
        return make_engine(bundled_model, system_prompt=SYSTEM, **kwargs)

    return build


SCENARIO = [
    ("alice", "My name is Alice Smith and my account number is 12345674."),
    ("alice", "Count from 1 to 5."),
    ("alice", "What is my account number?"),
    ("bob", "My name is Bob Jones and my account number is 87654323."),
    ("bob", "Count from 1 to 5."),
    ("bob", "What's my account number?"),
]


@pytest.mark.bundled
def test_the_reported_leak_through_the_engine(bundled_engine) -> None:  # type: ignore[no-untyped-def]
    engine = bundled_engine()
    replies = {(s, t): engine.chat(s, t, max_new_tokens=24) for s, t in SCENARIO}
    bob = replies[SCENARIO[-1]]
    assert "12345674" not in bob.text and not bob.stats.answer_cache_hit
    assert "87654323" not in replies[SCENARIO[2]].text


@pytest.mark.bundled
def test_the_reported_leak_through_langchain(bundled_engine) -> None:  # type: ignore[no-untyped-def]
    model = CachedChatModel(engine=bundled_engine(), max_tokens=24)
    replies = {}
    for user in ("alice", "bob"):
        messages: list = [SystemMessage(SYSTEM)]
        for session, text in SCENARIO:
            if session == user:
                messages.append(HumanMessage(text))
                reply = model.invoke(messages)
                assert isinstance(reply, AIMessage)
                messages.append(reply)
        replies[user] = messages[-1]
    assert "12345674" not in str(replies["bob"].content)
    assert replies["bob"].response_metadata.get("tier") != "answer"


@pytest.mark.bundled
def test_the_reported_leak_through_the_cli(bundled_model, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    model_dir = bundled_model.model.name_or_path
    url = f"sqlite:///{tmp_path}/cli.db"
    last: dict = {}  # type: ignore[type-arg]
    for session, text in SCENARIO:
        code = main(["ask", "--model", model_dir, "--db", url, "--session", session, "--system", SYSTEM,
                     "--max-new-tokens", "24", "--json", text])
        assert code == 0
        last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "12345674" not in last["reply"] and not last["stats"]["answer_cache_hit"]


@pytest.mark.bundled
def test_randomized_sessions_never_see_each_others_secrets(bundled_engine) -> None:  # type: ignore[no-untyped-def]
    rng = random.Random(20261201)
    engine = bundled_engine()
    names = ["Alice", "Bob", "Chen", "Dana", "Emeka", "Fatima"]
    asks = ["What is my account number?", "what's my account number", "Tell me my account number.", "Which account number did I give?"]
    secrets = {}
    for index, name in enumerate(names):
        secret = str(rng.randrange(10**7, 10**8))
        secrets[f"s{index}"] = secret
        opener = rng.choice([f"My name is {name} and my account number is {secret}.", f"Hi, I'm {name}. Account {secret}."])
        engine.chat(f"s{index}", opener, max_new_tokens=24)
        engine.chat(f"s{index}", "Count from 1 to 5.", max_new_tokens=24)
    for session, secret in secrets.items():
        reply = engine.chat(session, rng.choice(asks), max_new_tokens=24)
        others = [other for s, other in secrets.items() if s != session]
        assert not any(other in reply.text for other in others), (session, reply.text)


SICK_NOTE = "Draft a short sick note to the office saying that {} and will be off work this week."


def test_an_answer_found_by_meaning_across_users_never_echoes_another_question(tiny_model, make_engine, toy_embed) -> None:  # type: ignore[no-untyped-def]
    """Names the personal-data patterns cannot see: a shared answer that repeats its own question's
    particulars is not served for a paraphrase that lacks them; one that does not repeat them is."""
    from chatcache.answer_cache import AnswerCache, Scope

    cache = AnswerCache(AnswerCacheConfig(similarity_threshold=0.3, verify=False), toy_embed)
    shared = Scope("m", "bot")
    cache.store(SICK_NOTE.format("Jane Doe has the flu"), "Dear team, Jane Doe has the flu.", shared, 0.0, 1.0)
    paraphrase = SICK_NOTE.format("Ann Lee has covid")
    assert cache.lookup(paraphrase, shared) is not None  # by meaning, the same request
    assert cache.lookup(paraphrase, shared, across_users=True) is None
    cache.store("What are your opening hours?", "We open at 9 and close at 5.", shared, 0.0, 1.0)
    served = cache.lookup("what are your hours of opening", shared, across_users=True)
    assert served is not None and served.answer == "We open at 9 and close at 5."


def test_a_cacheable_intent_keeps_only_answers_written_without_a_conversation() -> None:
    done = TurnContext(cacheable=True, confirmed=True, dialogue_state="DONE", intent="opening_hours")
    first = answer_scope(BASE, "local", _conversation("a"), done, "When do you open?")
    later = answer_scope(BASE, "local", _conversation("b", "I'm travelling with my wife Jane", "Lovely."), done, "When do you open?")
    assert first is not None and later is not None and first.scope == later.scope  # every wording, every user
    assert first.storable and first.across_users
    assert not later.storable  # the model saw somebody's conversation when it wrote this one


@pytest.mark.bundled
def test_a_first_question_about_someone_is_not_served_to_another_user(bundled_engine, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """The reviewer's case on the real embedder: the two requests are 0.79 apart, above the threshold."""
    alice = bundled_engine(user_id="alice")
    asked = SICK_NOTE.format("Jane Doe has the flu")
    alice.sessions.create("a")
    where = alice.turns.answer_scope("a", asked)
    assert where is not None and where.storable  # nothing the patterns know as personal
    # As the engine keeps a finished first answer (the model's own note runs past any short limit).
    assert alice.answer_cache.store(asked, "Dear team, Jane Doe has the flu and will be off this week.", where.scope, 0.5, 900.0)
    bob = bundled_engine(user_id="bob")
    reply = bob.chat("b", SICK_NOTE.format("Ann Lee has covid"), max_new_tokens=48)
    assert not reply.stats.answer_cache_hit and "Jane" not in reply.text


def test_the_bots_own_words_in_a_shared_answer_are_nobodys_particulars(toy_embed) -> None:  # type: ignore[no-untyped-def]
    from chatcache.answer_cache import AnswerCache, Scope
    from chatcache.answer_cache.verify import stems

    cache = AnswerCache(AnswerCacheConfig(similarity_threshold=0.2, verify=False), toy_embed)
    shared = Scope("m", "bot")
    cache.store("What are your opening hours?", "Our opening hours are 9 to 5.", shared, 0.0, 1.0)
    asked = "what are your hours"
    assert cache.lookup(asked, shared) is not None
    assert cache.lookup(asked, shared, across_users=True) is None  # "opening" could be someone's
    bot_words = frozenset(stems("Intent opening hours: What are your opening hours? When does the branch open?"))
    hit = cache.lookup(asked, shared, across_users=True, common_words=bot_words)
    assert hit is not None and hit.answer == "Our opening hours are 9 to 5."
