"""Gateway chats: what one chat's sandbox may see of the profile's per-conversation files
(contract X19). An adapter only: which files a chat named, and which of them reach its
sandbox, is the native core's (``hermes-binding/src/chats.rs``); this hands it each turn's
messages from Hermes' ``pre_llm_call`` hook, which runs in the chat's session before its
tools.
"""

from __future__ import annotations

import logging
from typing import Any, Iterator

from ._hermes import session_identity

logger = logging.getLogger("hermes_e2b")

#: Whether this Hermes hands the plugin each turn's messages: only then is a chat's sandbox
#: limited to what the chat named (else it would get none of its own attachments either).
_tracking = False


def tracking() -> bool:
    return _tracking


def _texts(user_message: Any, history: Any) -> Iterator[str]:
    """The text of every message: a string content, or the text parts of a list of parts."""
    if isinstance(user_message, str):
        yield user_message
    for message in history if isinstance(history, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            yield content
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, dict) and isinstance(part.get("text"), str):
                    yield part["text"]


def on_pre_llm_call(user_message: Any = None, conversation_history: Any = None, **_: Any) -> None:
    """Notes what this turn's messages name, for the chat that sends them (a gateway chat's
    session key; a session without one, the CLI, sees the whole profile anyway)."""
    key, _session_id = session_identity()
    if not key:
        return None
    from . import _native
    from .live import live_environments

    if _native.note_chat_texts(key, list(_texts(user_message, conversation_history))):
        # A newly named file reaches the chat's sandbox at its next command, not after
        # Hermes' sync interval.
        for env in live_environments().values():
            if getattr(env, "_session_identity", ("", ""))[0] == key:
                env.force_next_push()
    return None


def register(ctx: Any) -> None:
    """Registers the turn hook where the host has it (feature-detected)."""
    hook = getattr(ctx, "register_hook", None)
    if hook is None:
        # A host this old has no gateway sessions either: nothing to keep apart.
        logger.debug("hermes-e2b: this Hermes has no plugin hooks; chats' attachments are not tracked")
        return
    global _tracking
    try:
        hook("pre_llm_call", on_pre_llm_call)
        _tracking = True
    except Exception as error:  # noqa: BLE001 - a refused hook must not fail the load
        logger.warning("hermes-e2b: pre_llm_call refused (%s); a gateway chat's sandbox gets every "
                       "chat's attachments", error)
