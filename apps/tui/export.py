"""Write a session from the session tier as Markdown (to read) and JSON (to process)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from chatcache.engine import Sessions
from chatcache.storage import ChatSession, default_data_dir
from chatcache.storage import Message as StoredMessage

_SPEAKERS = {"user": "You", "assistant": "Bot", "system": "System"}


def session_markdown(session: ChatSession, messages: list[StoredMessage]) -> str:
    lines = [f"# {session.title or session.id}", "", f"Session `{session.id}`, bot `{session.bot}`.", ""]
    for message in messages:
        lines += [f"**{_SPEAKERS.get(message.role.value, message.role.value)}:**", "", message.content, ""]
    return "\n".join(lines)


def session_json(session: ChatSession, messages: list[StoredMessage]) -> str:
    data = {
        "session": {
            "id": session.id,
            "title": session.title,
            "bot": session.bot,
            "status": session.status.value,
            "created_at": session.created_at.isoformat(),
            "updated_at": session.updated_at.isoformat(),
        },
        "messages": [
            {
                "role": m.role.value,
                "content": m.content,
                "created_at": m.created_at.isoformat(),
                # token ids are an internal detail of the token tier: left out
                "meta": {k: v for k, v in (m.meta or {}).items() if k != "token_ids"},
            }
            for m in messages
        ],
    }
    return json.dumps(data, indent=2, ensure_ascii=False) + "\n"


def default_export_dir() -> Path:
    """`chatcache` in the user's documents folder if there is one, else `exports` in the data dir.

    Not the working directory: run from a checkout, that put conversations inside the repository.
    """
    documents = os.environ.get("XDG_DOCUMENTS_DIR") or str(Path.home() / "Documents")
    if Path(documents).expanduser().is_dir():
        return Path(documents).expanduser() / "chatcache"
    return default_data_dir() / "exports"


def export_session(sessions: Sessions, session_id: str, directory: Path) -> tuple[Path, Path]:
    """Write `<session>.md` and `<session>.json` into `directory` (created if missing).

    Raises:
        UnknownSessionError: the session has no record yet.
        OSError: the directory cannot be written.
    """
    session = sessions.get(session_id)
    messages = sessions.records(session_id)
    directory = Path(directory).expanduser().resolve()
    directory.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^\w.-]+", "_", session_id)
    markdown, json_file = directory / f"{stem}.md", directory / f"{stem}.json"
    markdown.write_text(session_markdown(session, messages), encoding="utf-8")
    json_file.write_text(session_json(session, messages), encoding="utf-8")
    return markdown, json_file
