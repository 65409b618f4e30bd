"""The one tokenizer-free token estimate (about four characters per token) for prompts the gateway has not
tokenized: the scheduler needs a prompt's size before the worker sees it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

CHARS_PER_TOKEN = 4
"""Characters per token of the estimate."""
MESSAGE_OVERHEAD_TOKENS = 4
"""Chat-template tokens around each message (role markers)."""
PROMPT_OVERHEAD_TOKENS = 3
"""Chat-template tokens of the whole prompt (the assistant turn's header)."""


def text_tokens(text: str) -> int:
    """Estimated tokens of a plain text: characters / 4, at least 1."""
    return max(1, len(text) // CHARS_PER_TOKEN)


def message_tokens(messages: Iterable[Mapping[str, Any]]) -> int:
    """Estimated tokens of a chat prompt (string or text parts): characters / 4 plus the template's overhead."""
    chars = 0
    n = 0
    for m in messages:
        n += 1
        c = m.get("content")
        if isinstance(c, str):
            chars += len(c)
        elif isinstance(c, list):
            chars += sum(len(str(p.get("text", ""))) for p in c if isinstance(p, dict))
    return max(1, chars // CHARS_PER_TOKEN + MESSAGE_OVERHEAD_TOKENS * n + PROMPT_OVERHEAD_TOKENS)
