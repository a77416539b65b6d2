"""A small in-process cache of rendered output that depends only on a stored result (a project's rollup), so a
reload costs a dictionary lookup instead of rendering 200 annotators' rows again.

Keys name everything the output is a function of (the project, the rollup's `computed_at`, the scope, the layout);
nothing viewer-specific (CSRF token, user, "as of N s ago") goes into a cached value, and a caller reads the cache
only after its permission check. Bounded by the bytes held (least recently used out first), per process: each app
process renders once per rollup, which is what the leads' reload loop was costing the annotators in that process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable

MAX_BYTES = 8 * 1024 * 1024
"""The most the cache holds, in bytes of its values (a large project's page body is ~400 KB, its JSON ~150 KB)."""


class FragmentCache:
    """str or bytes values under hashable keys, least recently used evicted past `max_bytes`; thread-safe (the
    server runs requests in a thread pool)."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[Hashable, str | bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.hits = self.misses = 0

    def get(self, key: Hashable) -> str | bytes | None:
        with self._lock:
            value = self._items.get(key)
            if value is None:
                self.misses += 1
                return None
            self._items.move_to_end(key)
            self.hits += 1
            return value

    def put(self, key: Hashable, value: str | bytes) -> None:
        size = len(value)
        if size > self.max_bytes // 4:  # one huge value would flush everything else
            return
        with self._lock:
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._items[key] = value
            self._bytes += size
            while self._bytes > self.max_bytes:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= len(evicted)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
            self.hits = self.misses = 0

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)
