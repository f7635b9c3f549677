"""The sessions sidebar: the session tier's conversations, most recently active first."""

from __future__ import annotations

from textual.widgets import OptionList
from textual.widgets.option_list import Option

from chatcache.storage import ChatSession

AGENT_MARK = "[agent]"  # leads the label of a session a person has taken over: the handoff queue at a glance


def session_label(session: ChatSession, handed_off: bool) -> str:
    name = session.title or session.id
    return f"{AGENT_MARK} {name}" if handed_off else name


class SessionList(OptionList):
    """One option per session; the option id is the session id. Selecting one resumes it."""

    def show(self, sessions: list[ChatSession], current: str, pending: bool, handed_off: set[str]) -> None:
        """List `sessions` in the given order; `current` is highlighted.

        Args:
            sessions: from the session tier, most recent first.
            current: the open session's id.
            pending: the open session has no message yet, so the session tier does not know it.
            handed_off: the ids of the sessions a person has taken over (marked `AGENT_MARK`).
        """
        # "(new)" leads: a long label is cut at the end (see app.tcss), never wrapped onto a
        # second line that would read as another session.
        options = [Option(f"(new) {current}", id=current)] if pending else []
        options += [Option(session_label(s, s.id in handed_off), id=s.id) for s in sessions if not (pending and s.id == current)]
        self.clear_options()
        self.add_options(options)
        ids = [option.id for option in options]
        if current in ids:
            self.highlighted = ids.index(current)

    @property
    def session_ids(self) -> list[str]:
        return [self.get_option_at_index(i).id or "" for i in range(self.option_count)]
