"""The prompt of a worker request, as the prefix index hashes it (``gateway.core.prefix.prompt_prefix``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["request_prompt"]

MAX_PROMPT_CHARS = 1 << 20
"""Text beyond this many characters is not looked at (a shared prefix sits at the start)."""


def request_prompt(body: Mapping[str, Any]) -> str | list[int] | None:
    """The prompt of an OpenAI-style request body: a completion's ``prompt`` (text or token ids), or a chat's
    messages rendered in order; None when it holds neither in a form worth hashing."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt[:MAX_PROMPT_CHARS]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        return prompt
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return None
    parts: list[str] = []
    size = 0
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        text = _content_text(m.get("content"))
        parts.append(f"<|{m.get('role', '')}|>{text}")
        size += len(text)
        if size >= MAX_PROMPT_CHARS:
            break
    return "".join(parts)[:MAX_PROMPT_CHARS] or None


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones, in order
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and isinstance(p.get("text"), str))
    return ""
