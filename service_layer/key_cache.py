"""Recently verified API keys, held for a few seconds so a busy client's requests skip the key
lookup (a thread hop and a database round trip on every call). An entry is who the key acts as
(``contracts.roles.Principal``: tenant and role).

Keyed by the key's SHA-256 digest, never the key. Only successful lookups are held: an unknown or
revoked key is looked up every time. A key revoked in the database stops working once its entry
ages out (``ttl_s``), and at once in the process that revokes it (``forget_everywhere``). One cache
per app, as an app serves one database.
"""

from __future__ import annotations

import threading
import time
import weakref

from contracts.roles import Principal

TTL_S = 5.0
MAX_ENTRIES = 10_000  # bounded: a flood of valid keys cannot grow it without end


class KeyCache:
    def __init__(self, ttl_s: float = TTL_S, max_entries: int = MAX_ENTRIES) -> None:
        self.ttl_s, self.max_entries = ttl_s, max_entries
        self._entries: dict[str, tuple[float, Principal]] = {}
        self._lock = threading.Lock()
        _CACHES.add(self)

    def get(self, digest: str) -> Principal | None:
        entry = self._entries.get(digest)
        if entry is None or entry[0] < time.monotonic():
            return None
        return entry[1]

    def put(self, digest: str, tenant: Principal) -> None:
        with self._lock:
            if len(self._entries) >= self.max_entries:
                now = time.monotonic()
                self._entries = {d: e for d, e in self._entries.items() if e[0] >= now}
                if len(self._entries) >= self.max_entries:
                    self._entries.clear()
            self._entries[digest] = (time.monotonic() + self.ttl_s, tenant)

    def forget_all(self) -> None:
        with self._lock:
            self._entries.clear()


_CACHES: weakref.WeakSet[KeyCache] = weakref.WeakSet()


def forget_everywhere() -> None:
    """Drop every verified key this process holds (a key was revoked)."""
    for cache in list(_CACHES):
        cache.forget_all()
