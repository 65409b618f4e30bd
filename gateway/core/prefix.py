"""Prompt prefixes shared between calls (``PrefixSeg`` chains), and ``PrefixIndex``: the gateway's approximate
picture of what each worker has cached (docs/architecture.md, "Prefixes")."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from gateway.core.pickled import field_values
from gateway.core.tokens import CHARS_PER_TOKEN

BLOCK_TOKENS = 16
"""vLLM's KV block size (``--block-size``) on GPUs, the default of ``PerfProfile.block_tokens``: the unit of
prefix reuse (vLLM's CPU backend uses 128)."""


@dataclass(frozen=True, slots=True)
class PrefixSeg:
    """A run of prompt tokens other calls share; ``per_query``: only by calls of the same workflow."""

    name: str
    tokens: int
    per_query: bool = False

    def __post_init__(self) -> None:
        if self.tokens < 0:
            raise ValueError(f"prefix segment {self.name!r}: tokens must be >= 0, got {self.tokens}")

    def __reduce__(self) -> tuple[type[PrefixSeg], tuple[object, ...]]:
        return type(self), field_values(self)


Key = int
"""A segment's cache key: the hash of its own name (shared) or (workflow id, name) (per query) chained to the
key before it, as vLLM chains its block hashes."""


def segment_keys(prefix: Sequence[PrefixSeg], wid: int) -> list[tuple[Key, int]]:
    """The cache keys of a call's chain, in order, with each segment's tokens (empty segments dropped); a key
    hashes the segment's name with the key before it (as vLLM chains block hashes)."""
    out: list[tuple[Key, int]] = []
    parent = 0
    for seg in prefix:
        if seg.tokens <= 0:
            continue
        own: Hashable = (wid, seg.name) if seg.per_query else seg.name
        key = hash((parent, own))  # chained like vLLM's block hashes; flat keys keep lookups O(1) in chain length
        out.append((key, seg.tokens))
        parent = key
    return out


def prompt_prefix(
    prompt: str | Sequence[int | str], *, block_tokens: int = 64, max_blocks: int = 128
) -> tuple[PrefixSeg, ...]:
    """A prompt as a chain of at most ``max_blocks`` full blocks, each named by a hash of its content (as llm-d's
    approximate prefix scorer): ``block_tokens`` tokens (or ``x CHARS_PER_TOKEN`` characters of text) each."""
    if block_tokens < 1 or max_blocks < 0:
        raise ValueError(f"block_tokens must be >= 1 and max_blocks >= 0, got {block_tokens}, {max_blocks}")
    if isinstance(prompt, str):
        width = block_tokens * CHARS_PER_TOKEN
        n = min(len(prompt) // width, max_blocks)
        # Characters, not bytes, decide the blocks; each block's own text is hashed.
        blocks = [prompt[i * width : (i + 1) * width].encode("utf-8", "surrogatepass") for i in range(n)]
    else:
        # Tokens hold no whitespace, so a space-joined block is unambiguous; one join per block, not a Python
        # step per token (a 14k-token prompt is under a thousand blocks).
        n = min(len(prompt) // block_tokens, max_blocks)
        blocks = [
            " ".join(map(str, prompt[i * block_tokens : (i + 1) * block_tokens])).encode("utf-8", "surrogatepass")
            for i in range(n)
        ]
    return tuple(PrefixSeg(hashlib.blake2b(b, digest_size=8).hexdigest(), block_tokens) for b in blocks)


def cached_tokens(matched: int, input_tokens: int, block_tokens: int = BLOCK_TOKENS) -> int:
    """Prompt tokens vLLM skips when ``matched`` leading tokens are cached: whole blocks, never the last token."""
    usable = min(matched, input_tokens - 1)
    if usable <= 0:
        return 0
    return usable - usable % block_tokens


def best_case_cached(calls: Sequence[tuple[Sequence[PrefixSeg], int]], block_tokens: int = BLOCK_TOKENS) -> list[int]:
    """Prompt tokens each call of one workflow (in issue order) could at best take from the cache (an upper bound)."""
    seen: set[str] = set()
    out: list[int] = []
    for prefix, n_in in calls:
        matched = 0
        for seg in prefix:
            if seg.per_query and seg.name not in seen:
                break
            matched += seg.tokens
        out.append(cached_tokens(matched, n_in, block_tokens))
        seen.update(seg.name for seg in prefix if seg.per_query)
    return out


Holders = dict[Key, dict[int, list[float]]]
"""A reverse index shared by the ``PrefixIndex`` of every worker of a cluster: key -> {worker: its entry there}
(``[tokens, cached from]``, the very list the worker's index holds)."""


class PrefixIndex:
    """What the gateway believes one worker has cached: segment keys, least recently used first (evicted beyond
    ``capacity_tokens``), mirrored in the cluster's reverse index ``holders`` under ``worker``."""

    def __init__(self, capacity_tokens: int, holders: Holders | None = None, worker: int = -1) -> None:
        if capacity_tokens < 0:
            raise ValueError(f"capacity_tokens must be >= 0, got {capacity_tokens}")
        if holders is not None and worker < 0:
            raise ValueError("a PrefixIndex in a reverse index needs its worker's index")
        self.capacity_tokens = capacity_tokens
        self._lru: OrderedDict[Key, list[float]] = OrderedDict()  # key -> [tokens, cached from]
        self._total = 0
        self._holders = holders
        self._worker = worker

    def __len__(self) -> int:
        return len(self._lru)

    @property
    def tokens(self) -> int:
        """Tokens the index holds."""
        return self._total

    def match(self, keys: Sequence[tuple[Key, int]], now: float = float("inf")) -> int:
        """Leading tokens of the chain ``keys`` the worker is believed to hold at ``now`` (no recency update); a
        segment counts from the time ``record`` gave."""
        got = 0
        lru: dict[Key, list[float]] = self._lru  # looked up as a plain dict (the compiled build's fast path)
        chain: list[tuple[Key, int]] = keys if isinstance(keys, list) else list(keys)
        for key, tokens in chain:
            e = lru.get(key)
            if e is None or e[1] > now:
                break
            got += tokens
        return got

    def record(self, keys: Sequence[tuple[Key, int]], ready_at: float = 0.0) -> None:
        """A call with chain ``keys`` was sent to the worker; its segments count as cached from ``ready_at`` (the
        scheduler passes the dispatch time). A segment already held keeps the earlier of the two times."""
        lru = self._lru
        holders = self._holders
        for key, tokens in keys:
            e = lru.get(key)
            if e is not None:
                lru.move_to_end(key)
                e[1] = min(e[1], ready_at)
            else:
                e = [tokens, ready_at]
                lru[key] = e
                self._total += tokens
                if holders is not None:
                    h = holders.get(key)
                    if h is None:
                        holders[key] = {self._worker: e}
                    else:
                        h[self._worker] = e
        while self._total > self.capacity_tokens and lru:
            key, e = lru.popitem(last=False)
            self._total -= int(e[0])
            self._unhold(key)

    def _unhold(self, key: Key) -> None:
        holders = self._holders
        if holders is not None:
            h = holders[key]
            del h[self._worker]
            if not h:
                del holders[key]

    def clear(self) -> None:
        """Forget everything (the worker restarted or left)."""
        for key in self._lru:
            self._unhold(key)
        self._lru.clear()
        self._total = 0


def match_holders(holders: Holders, keys: Sequence[tuple[Key, int]], now: float = float("inf")) -> dict[int, int]:
    """``PrefixIndex.match`` of ``keys`` on every worker holding any of it at once: {worker: leading tokens}."""
    got: dict[int, int] = {}
    alive: list[int] = []
    first = True
    for key, tokens in keys:
        h = holders.get(key)
        if h is None:
            break
        if first:
            alive = [w for w, e in h.items() if e[1] <= now]
            first = False
        else:
            nxt: list[int] = []
            for w in alive:
                e = h.get(w)
                if e is not None and e[1] <= now:
                    nxt.append(w)
            alive = nxt
        if not alive:
            break
        for w in alive:
            got[w] = got.get(w, 0) + tokens
    return got
