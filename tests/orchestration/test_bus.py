"""One suite, both bus backends (the ``bus`` fixture runs it on InProcessBus and on RedisBus)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from orchestration.bus import Bus, InProcessBus, default_prefix, make_bus
from orchestration.bus.redis_bus import RedisBus
from orchestration.settings import Settings
from resource_layer.liveness import LivenessBatcher, node_alive_key


async def _next(it, timeout: float = 5.0):  # type: ignore[no-untyped-def]
    return await asyncio.wait_for(it.__anext__(), timeout)


def test_publish_reaches_subscribers_of_that_channel_only(bus: Bus) -> None:
    async def main() -> None:
        async with bus.subscribe("job.a") as a, bus.subscribe("job.b", "events") as b:
            bus.publish("job.a", {"n": 1})
            bus.publish("events", {"n": 2, "nested": {"xs": [1, 2]}})
            bus.publish("job.b", {"n": 3})
            assert await _next(a) == ("job.a", {"n": 1})
            assert await _next(b) == ("events", {"n": 2, "nested": {"xs": [1, 2]}})
            assert await _next(b) == ("job.b", {"n": 3})
            with pytest.raises(TimeoutError):
                await _next(a, timeout=0.3)  # nothing else was meant for a

    asyncio.run(main())


def test_pattern_subscription(bus: Bus) -> None:
    async def main() -> None:
        async with bus.subscribe("node.*") as sub:
            bus.publish("job.x", {"skip": True})
            bus.publish("node.n1", {"assignment": {"assignment_id": "t1"}})
            assert await _next(sub) == ("node.n1", {"assignment": {"assignment_id": "t1"}})

    asyncio.run(main())


def test_publish_from_other_threads_is_delivered_in_order(bus: Bus) -> None:
    async def main() -> None:
        async with bus.subscribe("events") as sub:
            t = threading.Thread(target=lambda: [bus.publish("events", {"i": i}) for i in range(50)])
            t.start()
            got = [(await _next(sub))[1]["i"] for _ in range(50)]
            t.join()
            assert got == list(range(50))

    asyncio.run(main())


def test_messages_must_be_json_objects(bus: Bus) -> None:
    with pytest.raises(TypeError):
        bus.publish("events", ["not", "a", "dict"])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        bus.publish("events", {"x": object()})
    with pytest.raises(ValueError):
        bus.publish("bad channel", {})


def test_ttl_keys_expire(bus: Bus) -> None:
    bus.touch("node.a.alive", 0.3)
    bus.touch("node.b.alive", 30)
    assert bus.alive("node.a.alive") and bus.alive("node.b.alive")
    assert not bus.alive("node.never.alive")
    assert bus.expired(["node.a.alive", "node.b.alive", "node.never.alive"]) == ["node.never.alive"]
    time.sleep(0.45)
    assert not bus.alive("node.a.alive")
    assert bus.expired(["node.a.alive", "node.b.alive"]) == ["node.a.alive"]
    bus.touch("node.a.alive", 30)  # a heartbeat revives it
    assert bus.alive("node.a.alive")


def test_touch_many_and_the_heartbeat_batcher_refresh_every_key(bus: Bus) -> None:
    bus.touch_many(["node.a.alive", "node.b.alive"], 30)
    assert bus.expired(["node.a.alive", "node.b.alive", "node.c.alive"]) == ["node.c.alive"]

    async def main() -> None:
        counted: list[int] = []
        batcher = LivenessBatcher(bus, ttl_s=30, flush_every_s=0.01, on_flushed=counted.append)
        for node in ("x", "y", "x"):
            batcher.touch(node)
        assert bus.expired([node_alive_key("x"), node_alive_key("y")]) == [node_alive_key(n) for n in "xy"]
        deadline = time.monotonic() + 10
        # counted once the flush returns, a moment after the keys are set
        while bus.expired([node_alive_key("x"), node_alive_key("y")]) or sum(counted) < 3:
            assert time.monotonic() < deadline, "the batch was never flushed"
            await asyncio.sleep(0.01)
        await batcher.close()
        assert sum(counted) == 3  # every heartbeat counted once, when its key was refreshed

    asyncio.run(main())


def test_lock_is_exclusive_and_released(bus: Bus) -> None:
    with bus.lock("reaper", 5) as first:
        assert first
        with bus.lock("reaper", 5) as second:
            assert not second
        with bus.lock("other", 5) as other:
            assert other
    with bus.lock("reaper", 5) as again:
        assert again


def test_lock_expires_after_ttl(bus: Bus) -> None:
    with bus.lock("short", 0.2) as held:
        assert held
        time.sleep(0.35)
        with bus.lock("short", 5) as taken_over:
            assert taken_over  # a crashed holder cannot block the others forever


def test_make_bus_follows_settings() -> None:
    assert isinstance(make_bus(Settings(redis_url=None)), InProcessBus)
    bus = make_bus(Settings(redis_url="redis://127.0.0.1:6379/0"), prefix="cpntest:mk:")
    assert isinstance(bus, RedisBus) and bus.prefix == "cpntest:mk:"
    bus.close()
    # by default the prefix follows the database: same database, same bus
    pg = Settings(redis_url="redis://127.0.0.1:6379/0", database_url="postgresql://u:pw@db:5432/cpn_prod")
    assert default_prefix(pg) == "cpn:cpn_prod:"
    lite = Settings(redis_url="redis://127.0.0.1:6379/0", database_url="sqlite:////var/lib/cpn/my db.sqlite")
    assert default_prefix(lite) == "cpn:my_db.sqlite:"
