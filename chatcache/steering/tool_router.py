"""Whether a question calls for one of the bound tools, read by meaning as intents are.

Left to decide alone (`tool_choice="auto"`), the bundled 135M model never starts a call: five
questions that each ask for what a bound tool does were all answered in text, under two
wordings of the tools prompt. So, as
semantic routers do, a question whose embedding is close enough to a tool's name and
description (cosine at least `threshold`) makes the reply a call of the closest tool; below it
the model decides, held to the format either way. The threshold is tuned on
SGD's services, whose intents are tools with descriptions (`chatcache eval tools`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..model.tools import Tool
from .hcac import Embed

TOOL_ROUTE_THRESHOLD = 0.325  # tuned on the even dialogues of SGD dev (`chatcache eval tools`): 0.87 of due calls, 0.054 false on the odd ones


def tool_text(tool: Tool) -> str:
    """What a tool is matched on: its name in words and its description."""
    return f"{tool.name.replace('_', ' ')}: {tool.description}".strip()


class ToolRouter:
    """Picks the tools a question is about.

    Args:
        embed: unit-normalised sentence embeddings.
        threshold: the cosine from which a question is taken to be about a tool.
    """

    def __init__(self, embed: Embed, threshold: float = TOOL_ROUTE_THRESHOLD) -> None:
        self.embed = embed
        self.threshold = threshold

    def scores(self, question: str, tools: Sequence[Tool]) -> list[float]:
        """The cosine of `question` with each tool."""
        vectors = self.embed([question, *(tool_text(tool) for tool in tools)])
        return [float(score) for score in np.asarray(vectors[1:]) @ np.asarray(vectors[0])]

    def called(self, question: str, tools: Sequence[Tool]) -> list[Tool]:
        """The tools `question` is about, closest first; empty when it is about none."""
        ranked = sorted(zip(self.scores(question, tools), range(len(tools))), reverse=True)
        return [tools[index] for score, index in ranked if score >= self.threshold]
