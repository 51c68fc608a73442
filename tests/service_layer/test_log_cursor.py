"""The follower's cursor: a line committed after a newer-numbered one was sent is still sent, once."""

from __future__ import annotations

from dataclasses import dataclass

from service_layer.log_cursor import FollowCursor


@dataclass(frozen=True)
class Line:
    seq: int


def seqs(lines: list[Line]) -> list[int]:
    return [line.seq for line in lines]


def test_a_late_commit_below_the_newest_sent_is_sent_once() -> None:
    c = FollowCursor(after=0, settle_s=3.0)
    assert seqs(c.unsent([Line(111), Line(112)])) == [111, 112]  # another writer's lines came first
    c.read_done(now=0.0)
    assert c.floor == 0 and c.last == 112  # not settled: 100..110 may still be committing
    assert seqs(c.unsent([Line(100), Line(101), Line(111), Line(112), Line(113)])) == [100, 101, 113]
    c.read_done(now=1.0)
    assert seqs(c.unsent([Line(100), Line(101), Line(111), Line(112), Line(113)])) == []
    c.read_done(now=3.5)  # the first read has settled: everything it saw up to 112 is final
    assert c.floor == 112
    assert seqs(c.unsent([Line(113), Line(114)])) == [114]  # 113 is remembered above the floor
    c.read_done(now=4.0)  # the second read (up to 113) settles here
    assert c.floor == 113


def test_the_floor_starts_at_the_clients_cursor_and_after_a_tail() -> None:
    c = FollowCursor(after=50)
    assert seqs(c.unsent([Line(49), Line(50), Line(51)])) == [51]
    tailed = FollowCursor(after=0)
    tailed.skip_before(900)
    assert tailed.floor == 899 and seqs(tailed.unsent([Line(899), Line(900)])) == [900]
