"""Are replies the same under load as alone? Conversations decoded together against the uncached path.

N conversations run at once on one engine (the scheduler batches their decodes; each turn reuses
its session's KV from the token tier). Then every turn's prompt, as the engine laid it out from
the recorded conversation, is answered once more on a fresh cache with nothing reused and
nothing beside it: the reference. A turn whose greedy reply differs is explained by the
reference's logits at the first differing token: a near-tie (its two best tokens closer than
`NEAR_TIE`) is float rounding in another order of additions, not a bug; anything else is.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import DynamicCache

from ..config import GenerationConfig
from ..engine import ChatEngine
from ..errors import ConfigError
from ..model.loading import ChatModel
from ..model.generation import forward, generate_tokens
from ..model_runner import eos_token_ids
from ..model.prompt import Message, RenderedSegments

NEAR_TIE = 1e-4  # top-2 logit gap below which batched and alone may pick differently


@dataclass(frozen=True)
class TurnAgreement:
    """One turn: whether the batched reply equals the reference, and if not, how close the call was."""

    conversation: int
    turn: int
    equal: bool
    first_difference: int | None = None
    top2_gap: float | None = None  # the reference's two best logits at the first differing token
    picked_runner_up: bool | None = None  # the batched token was the reference's second best


@dataclass(frozen=True)
class AgreementReport:
    turns: list[TurnAgreement]

    @property
    def equal_fraction(self) -> float:
        return sum(t.equal for t in self.turns) / len(self.turns) if self.turns else 1.0

    @property
    def unexplained(self) -> list[TurnAgreement]:
        """Differences that are not near-ties: each one is a defect."""
        return [t for t in self.turns if not t.equal and not (t.picked_runner_up and (t.top2_gap or 0) < NEAR_TIE)]

    def as_dict(self) -> dict[str, Any]:
        return {
            "turns": len(self.turns),
            "equal_fraction": round(self.equal_fraction, 4),
            "near_ties": [asdict(t) for t in self.turns if not t.equal and t not in self.unexplained],
            "unexplained": [asdict(t) for t in self.unexplained],
        }


def run_together(
    engine: ChatEngine, conversations: Sequence[Sequence[str]], max_new_tokens: int, prefix: str = "together"
) -> list[str]:
    """Run every conversation to its end, all at once, each in its own thread; their session ids."""
    sessions = [f"{prefix}-{i}" for i in range(len(conversations))]
    errors: list[BaseException] = []
    start = threading.Barrier(len(conversations))

    def converse(session_id: str, turns: Sequence[str]) -> None:
        try:
            start.wait()
            for text in turns:
                engine.chat(session_id, text, max_new_tokens=max_new_tokens)
        except BaseException as error:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(error)

    threads = [threading.Thread(target=converse, args=pair) for pair in zip(sessions, conversations)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return sessions


def compare_with_uncached(engine: ChatEngine, sessions: Sequence[str], max_new_tokens: int) -> AgreementReport:
    """Answer each recorded turn again on a fresh cache, alone, and compare the greedy replies.

    The engine must have run no drift, dialogue or answer cache on these sessions: the
    reference lays out every earlier turn and the system prompt, as a plain chatbot does.
    """
    if not isinstance(engine.chat_model, ChatModel):
        raise ConfigError("The batching agreement compares the engine with a local model's own forward pass.")
    model = engine.chat_model.model
    params = GenerationConfig(max_new_tokens=max_new_tokens)
    eos = eos_token_ids(engine.chat_model)
    system = [Message("system", engine.system_prompt)] if engine.system_prompt else []
    turns: list[TurnAgreement] = []
    for index, session_id in enumerate(sessions):
        history = engine.sessions.history(session_id)
        for turn in range(len(history) // 2):
            user, reply = history[2 * turn], history[2 * turn + 1]
            prompt = engine.renderer.conversation_ids([*system, *history[: 2 * turn], user], RenderedSegments())
            batched = list(reply.generated_ids or ())
            cache = DynamicCache(config=model.config)
            reference = [t.token_id for t in generate_tokens(model, cache, prompt, params, eos)]
            turns.append(_agreement(model, index, turn, prompt, batched, reference))
    return AgreementReport(turns)


def _agreement(model: Any, conversation: int, turn: int, prompt: list[int], batched: list[int], reference: list[int]) -> TurnAgreement:
    if batched == reference:
        return TurnAgreement(conversation, turn, equal=True)
    differ = next((i for i, (a, b) in enumerate(zip(batched, reference)) if a != b), min(len(batched), len(reference)))
    if differ >= min(len(batched), len(reference)):
        return TurnAgreement(conversation, turn, equal=False, first_difference=differ)  # one stopped early: no tie
    with torch.no_grad():
        logits = forward(model, prompt + reference[:differ], DynamicCache(config=model.config))
    best, second = torch.topk(logits, 2).values.tolist()
    runner_up = int(torch.topk(logits, 2).indices[1]) == batched[differ]
    return TurnAgreement(conversation, turn, False, differ, best - second, runner_up)
