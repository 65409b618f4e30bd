"""uvicorn's HTTP protocol with the writes of one event-loop turn sent as one system call (``HttpProtocol``):
docs/live-gateway.md, "Per-call overhead"."""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

__all__ = ["CoalescingTransport", "HttpProtocol"]


class CoalescingTransport(asyncio.Transport):
    """A transport whose writes within one event-loop turn reach the wrapped transport as one write; closing
    sends what is held first, aborting drops it, the write buffer size counts it (``writelines``: asyncio's, one
    ``write``). The methods in ``PASSED`` are the wrapped transport's own, bound per connection."""

    PASSED = (
        "can_write_eof",
        "is_closing",
        "get_extra_info",
        "get_protocol",
        "is_reading",
        "pause_reading",
        "resume_reading",
        "set_write_buffer_limits",
        "get_write_buffer_limits",
    )

    def __init__(self, inner: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._inner = inner
        self._loop = loop
        self._held: list[bytes] = []
        for name in self.PASSED:
            setattr(self, name, getattr(inner, name))

    def write(self, data: bytes | bytearray | memoryview[Any]) -> None:
        """Hold ``data`` until the end of this event-loop turn."""
        if not data:
            return
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append(bytes(data))

    def _flush(self) -> None:
        held = self._held
        if not held:
            return
        self._held = []
        if self._inner.is_closing():
            return
        self._inner.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        """Send what is held, then close."""
        self._flush()
        self._inner.close()

    def abort(self) -> None:
        """Drop what is held and abort the connection."""
        self._held = []
        self._inner.abort()

    def write_eof(self) -> None:
        """Send what is held, then close the write side."""
        self._flush()
        self._inner.write_eof()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        """Send what is held, then switch the wrapped transport's protocol (an upgraded connection)."""
        self._flush()
        self._inner.set_protocol(protocol)

    def get_write_buffer_size(self) -> int:
        """The wrapped transport's buffer plus what is held."""
        return self._inner.get_write_buffer_size() + sum(len(b) for b in self._held)


class HttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol over a ``CoalescingTransport`` (pass as ``uvicorn.Config(http=...)``)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Wrap the connection's transport, then as uvicorn."""
        super().connection_made(CoalescingTransport(transport, self.loop))
