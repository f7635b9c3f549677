"""Load a bot YAML file into a `BotDefinition` (and its conversation tests), with errors that name the line at fault.

Pydantic reports where a value is wrong as a path (`("intents", 1, "examples")`); a person
editing YAML wants a line number. We compose the YAML into its node tree, whose nodes carry
their position, and walk the same path through it. When the path ends at a key that is not
there (a missing field) we point at the mapping that should have held it.

YAML aliases (`*name`) are refused: a few nested ones expand a tiny file into billions of
values ("billion laughs"), every walk over the tree follows them, and a bot file never needs
them (an error in an aliased value would name the anchor's line, not the line at fault).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from .definition import BotDefinition, KnowledgeFile, Loc, reference_errors
from .stories import StoryFile
from .training import expand_path, read_labelled

Parsed = TypeVar("Parsed", bound=BaseModel)

BOTS_DIR = Path(__file__).parent / "bots"


class BotDefinitionError(ValueError):
    """A bot file that cannot be used; `problems` holds one "file line N: where: what" per fault."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def load_bot(path: str | Path) -> BotDefinition:
    """Read and validate a bot definition, with the files it names (actions, examples, knowledge).

    Args:
        path: A YAML file, or the name of a bot shipped in `dialog/bots` (e.g. "bank").

    Returns:
        The validated definition: intents carry the examples file's texts and the knowledge
        base's answers, and `actions` is the module's absolute path.

    Raises:
        BotDefinitionError: The YAML is malformed, the definition is invalid, or a file it
            names is missing or invalid; every problem found is listed with its line number.
        FileNotFoundError: There is no such file and no shipped bot of that name.
    """
    file = _resolve(path)
    return parse_bot(file.read_text(encoding="utf-8"), source=file.name, directory=file.parent)


def parse_bot(text: str, source: str = "<bot>", directory: Path | None = None) -> BotDefinition:
    """Validate a bot definition given as YAML text; `source` names it in error messages, and
    the files it names are found relative to `directory` (default: the working directory)."""
    bot, root = _validated(text, source, BotDefinition)
    bot = _with_files(bot, root, source, (directory or Path.cwd()).resolve())
    problems = [_format(source, root, loc, message) for loc, message in reference_errors(bot)]
    if problems:
        raise BotDefinitionError(problems)
    return bot


def _with_files(bot: BotDefinition, root: yaml.Node | None, source: str, directory: Path) -> BotDefinition:
    """The bot with what its files hold: the actions module's path, the intents' examples from
    the examples file, their curated answers from the knowledge base."""
    update: dict[str, Any] = {}
    intents = {intent.name: intent for intent in bot.intents}
    if bot.actions is not None:
        module = (directory / bot.actions).resolve()
        if not module.is_file():
            raise BotDefinitionError([_format(source, root, ("actions",), f"no file {bot.actions!r} next to the bot file")])
        update["actions"] = str(module)
    if bot.examples_file is not None:
        try:
            labelled = read_labelled(expand_path(bot.examples_file.path, directory))
        except (OSError, ValueError) as exc:
            raise BotDefinitionError([_format(source, root, ("examples_file", "path"), str(exc))]) from exc
        unknown = sorted(set(labelled) - set(intents))
        if unknown:
            message = f"the examples file has labels no intent takes: {', '.join(unknown)}"
            raise BotDefinitionError([_format(source, root, ("examples_file",), message)])
        per_intent = bot.examples_file.per_intent
        for name, texts in labelled.items():
            intent = intents[name]
            fresh = [text for text in texts if text not in intent.examples and text not in intent.calibration_examples]
            update_intent = {"examples": [*intent.examples, *fresh[:per_intent]]}
            if bot.examples_file.calibrate_on_rest:
                update_intent["calibration_examples"] = [*intent.calibration_examples, *fresh[per_intent:]]
            intents[name] = intent.model_copy(update=update_intent)
    if bot.knowledge is not None:
        file = directory / bot.knowledge
        try:
            knowledge_text = file.read_text(encoding="utf-8")
        except OSError as exc:
            raise BotDefinitionError([_format(source, root, ("knowledge",), f"cannot read {bot.knowledge!r}: {exc.strerror}")]) from exc
        knowledge, knowledge_root = _validated(knowledge_text, file.name, KnowledgeFile)
        problems = []
        for index, entry in enumerate(knowledge.answers):
            known = intents.get(entry.intent)
            if known is None or known.answer is not None:
                why = "no intent of that name" if known is None else "that intent already has an answer"
                problems.append(_format(file.name, knowledge_root, ("answers", index, "intent"), f"'{entry.intent}': {why}"))
            else:
                intents[entry.intent] = known.model_copy(update={"answer": entry.answer})
        if problems:
            raise BotDefinitionError(problems)
    if bot.examples_file is not None or bot.knowledge is not None:
        update["intents"] = [intents[intent.name] for intent in bot.intents]
    return bot.model_copy(update=update) if update else bot


def default_stories(bot: str | Path) -> Path:
    """The conversation tests that come with a bot, for `chatcache test-bot BOT` without files:
    `NAME/stories.yaml` beside the bot file `NAME.yaml` (the shipped bots' layout), else
    `stories.yaml` in the bot file's own directory (the layout `chatcache init` writes).

    Raises:
        FileNotFoundError: no bot of that name or file, or no stories beside it.
    """
    file = _resolve(bot)
    for candidate in (file.parent / file.stem / "stories.yaml", file.parent / "stories.yaml"):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(f"no stories beside {file}: name a story file (chatcache test-bot {bot} FILE)")


def load_stories(path: str | Path) -> StoryFile:
    """Read and validate a file of conversation tests (`dialog.stories`).

    Raises:
        BotDefinitionError: malformed YAML or an invalid story, each problem with its line.
    """
    file = Path(path)
    stories, _ = _validated(file.read_text(encoding="utf-8"), file.name, StoryFile)
    return stories


def _validated(text: str, source: str, model: type[Parsed]) -> tuple[Parsed, yaml.Node | None]:
    """`text` parsed as YAML (no aliases, no duplicate keys) and validated as `model`, with its node tree."""
    try:
        root = yaml.compose(text, Loader=_BotLoader)
        data: Any = yaml.load(text, Loader=_BotLoader)
    except _AliasRefused as exc:
        raise BotDefinitionError(
            [f"{source} line {exc.line}: YAML alias *{exc.anchor} is not allowed in a bot file; write the value out in full"]
        ) from exc
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise BotDefinitionError([f"{source} line {line}: YAML syntax error: {exc.problem}"]) from exc
    problems = [f"{source} line {line}: {msg}" for line, msg in _duplicate_keys(root)]
    try:
        parsed = model.model_validate(data if data is not None else {})
    except ValidationError as exc:
        for error in exc.errors():
            loc = tuple(error["loc"])
            message = error["msg"][:1].lower() + error["msg"][1:]
            problems.append(_format(source, root, loc, message))
        raise BotDefinitionError(problems) from exc
    if problems:
        raise BotDefinitionError(problems)
    return parsed, root


class _AliasRefused(Exception):
    """An alias met while composing; raised before anything expands it."""

    def __init__(self, anchor: str, line: int) -> None:
        super().__init__(anchor)
        self.anchor = anchor
        self.line = line


class _BotLoader(yaml.SafeLoader):  # type: ignore[misc]  # untyped base
    """PyYAML's safe loader, refusing aliases as it meets them: no file expands past its own size."""

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise _AliasRefused(event.anchor, event.start_mark.line + 1)
        node: yaml.Node = super().compose_node(parent, index)
        return node


def _resolve(path: str | Path) -> Path:
    file = Path(path)
    if file.exists():
        return file
    shipped = BOTS_DIR / f"{path}.yaml"
    if isinstance(path, str) and "/" not in path and shipped.exists():
        return shipped
    raise FileNotFoundError(f"no bot file {str(path)!r} and no shipped bot of that name in {BOTS_DIR}")


def _format(source: str, root: yaml.Node | None, loc: Loc, message: str) -> str:
    where = _loc_text(loc)
    return f"{source} line {_line_of(root, loc)}: {where + ': ' if where else ''}{message}"


def _loc_text(loc: Loc) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _line_of(node: yaml.Node | None, loc: Loc) -> int:
    """The 1-based line of the deepest node on `loc` that exists in the file."""
    if node is None:
        return 1
    line: int = node.start_mark.line + 1
    for part in loc:
        child = _child(node, part)
        if child is None:
            # Pydantic adds non-path parts for some errors (e.g. a union's member type);
            # skipping them keeps walking the real path rather than stopping at its parent.
            continue
        key, node = child
        # A field is named on its key's line; its block value may only start on the next.
        line = (key if key is not None else node).start_mark.line + 1
    return line


def _child(node: yaml.Node, part: str | int) -> tuple[yaml.Node | None, yaml.Node] | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in reversed(node.value):  # PyYAML keeps the last of duplicate keys
            if isinstance(key, yaml.ScalarNode) and key.value == str(part):
                return key, value
    elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
        return None, node.value[part]
    return None


def _duplicate_keys(node: yaml.Node | None) -> list[tuple[int, str]]:
    """PyYAML silently keeps the last of two equal keys; in a bot file that hides a mistake."""
    if node is None:
        return []
    found: list[tuple[int, str]] = []
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    found.append((key.start_mark.line + 1, f"duplicate key '{key.value}'"))
                seen.add(key.value)
            found += _duplicate_keys(value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            found += _duplicate_keys(item)
    return found
