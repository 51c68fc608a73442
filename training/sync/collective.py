"""A weighted average of one flat tensor over the live regions, bit-identical in every region.

With 3 or more live regions it is a ring over the configured order: a reduce-scatter (each hop
sends a running partial sum of one chunk, compressed with error feedback kept per hop) and an
all-gather in which each chunk's owner encodes the averaged chunk once and the others forward
those exact bytes, so every region decodes the same values. Each region then sends 2(R-1)/R of
the payload. With fewer live regions, or if a ring hop fails, every region pushes its own
contribution to every other and all sum the same decoded values in region order.

Hierarchical (``hierarchy``: groups of participants, each head first, the groups in the heads'
ring order): where every configured participant is live, each member sends its weighted
contribution to its group's head over their local link, the heads run the ring above over their
partial sums (one, two or more heads alike), and each head sends the averaged chunks' encodings,
as the ring forwarded them, back to its members, who decode the same bytes. A region's WAN links
then carry 2(G-1)/G of the payload for G groups instead of 2(P-1)/P for P participants. A
participant missing from the configured set runs the flat ring over the live ones; a failed hop
falls back to all-to-all as the ring does.

Only a failed call drops a peer: while a contribution is awaited its sender is checked, and
dropped at once if its connection is refused (``RegionNode.collect``); one still missing at the
deadline makes the region probe its sender, which is dropped if it does not answer. Regions may
briefly disagree on who takes part (a region readmitted by some peers first, a ring one region
finished and another saw break), so a broken ring falls back to all-to-all on the plain stream,
and a slow but live peer is only left out of that round: its averages may then differ, and the
anchors' fingerprints, compared every round, repair that from the lowest-named region. A peer that
has its result of the round already (its ring completed) answers a contribution to it "done" and
is not waited for: it sends none on the plain stream.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import torch
from torch import Tensor

from training.compression.codecs import Codec, EncodedTensor
from training.compression.error_feedback import ErrorFeedback
from training.sync.algorithms.outer import weighted_mean
from training.sync.algorithms.ring import all_gather_step, owned_chunk, reduce_scatter_step, ring_members
from training.sync.algorithms.schedule import fragment_slices
from training.sync.messages import InMessage, Meta, OutMessage, PushResult
from training.sync.node import GONE_CHECK_S, RegionNode
from training.sync.pipeline import PushQueue, part_slices
from training.sync.transport import PeerError


def _parse_origin(
    origin: str, fps: dict[str, str], figs: dict[str, tuple[float, float]] | None = None
) -> str:
    """Add ``name=fingerprint`` entries (joined by ';') to ``fps``, and to ``figs`` the balancing
    figures an entry carries (``name=fingerprint|opened_at|step_s``: a head forwards its group's);
    returns the first name."""
    first = ""
    for part in origin.split(";"):
        name, _, rest = part.partition("=")
        fp, *fig = rest.split("|")
        fps[name] = fp
        if figs is not None and len(fig) == 2:
            figs[name] = (float(fig[0]), float(fig[1]))
        first = first or name
    return first


def _entry(name: str, fp: str, figures: tuple[float, float]) -> str:
    return f"{name}={fp}|{figures[0]!r}|{figures[1]!r}"


class RingBroken(Exception):
    """A ring hop failed (its peer is marked dead): the round falls back to all-to-all."""


@dataclass
class Reduced:
    avg: Tensor
    fingerprints: dict[str, str]
    ring: bool
    stale: bool = False  # a peer had completed this round already: we are behind
    members: list[str] = field(default_factory=list)
    # Balancing figures per contributing region: (wall time it opened the round, seconds per step).
    figures: dict[str, tuple[float, float]] = field(default_factory=dict)


class DenseReducer:
    def __init__(
        self,
        node: RegionNode,
        stream: str,
        codec: Codec,
        chunk_bytes: int,
        error_feedback: bool,
        ring_order: list[str] | None,
        hierarchy: list[list[str]] | None = None,
    ) -> None:
        self.node, self.stream, self.codec = node, stream, codec
        self.chunk_bytes, self.error_feedback, self.ring_order = chunk_bytes, error_feedback, ring_order
        self.hierarchy = [list(g) for g in hierarchy or [] if g]
        self.me = node.region
        self.own = self._ef()
        self.hops: dict[str, ErrorFeedback] = {}  # ring: one residual per (ring, hop), see _hop
        self.figures: tuple[float, float] = (0.0, 0.0)  # this round's own balancing figures

    def _ef(self) -> ErrorFeedback:
        return ErrorFeedback(self.codec, self.chunk_bytes, self.error_feedback)

    def reset(self) -> None:
        """Drop carried residuals (after adopting a peer's state they no longer apply), and the
        rounds reduced: the adopted state's rounds may include ones this region had in flight."""
        self.own.commit(None)
        self.hops.clear()
        self.node.forget_reduced(self.stream)

    # ------------------------------------------------------------ the round

    def reduce(
        self,
        r: int,
        x: Tensor,
        weight: float,
        fingerprint: str,
        step: int,
        timeout: float,
        figures: tuple[float, float] = (0.0, 0.0),
    ) -> Reduced:
        """``figures``: this region's (opened_at, step_s) for work balancing; every region gets
        every contributor's in the result, on the messages the round sends anyway."""
        self.figures = figures
        out = self._reduce(r, x, weight, fingerprint, step, timeout)
        self.node.mark_reduced(self.stream, r)
        return out

    def _reduce(
        self, r: int, x: Tensor, weight: float, fingerprint: str, step: int, timeout: float
    ) -> Reduced:
        deadline = time.monotonic() + timeout
        participants = self.node.participants(r)
        members = ring_members(self.ring_order, [self.me, *participants])
        groups = self._groups(members)
        if groups is not None or len(members) >= 3:
            try:
                if groups is not None:
                    return self._hierarchical(r, x, weight, fingerprint, step, groups, deadline)
                return self._ring(r, x, weight, fingerprint, step, members, deadline)
            except RingBroken:
                participants = self.node.participants(r)
                deadline = time.monotonic() + timeout
                return self._all_to_all(r, x, weight, fingerprint, step, participants, deadline)
        return self._all_to_all(r, x, weight, fingerprint, step, participants, deadline)

    def _groups(self, live: list[str]) -> list[list[str]] | None:
        """The configured groups when every participant they name is live, else None: a round
        short of a member runs the flat ring over the live ones (a head's partial sum would
        otherwise lack a contribution the other heads cannot tell is missing)."""
        if not any(len(g) > 1 for g in self.hierarchy):
            return None
        if sorted(p for g in self.hierarchy for p in g) != sorted(live):
            return None
        return self.hierarchy

    def _send(self, peer: str, msg: OutMessage, timeout: float) -> Future:
        return self.node.pool.submit(self.node.client(peer).push, msg, timeout)

    def _acks(self, pushes: dict[str, Future], deadline: float, r: int) -> tuple[bool, list[str]]:
        stale, failed = False, []
        for p, fut in pushes.items():
            try:
                ack = self._await_ack(p, fut, deadline)
                if ack is None:  # dropped while we waited (the control plane reported it lost)
                    failed.append(p)
                    continue
                # Stale from a peer that takes part in this round: it completed it without us.
                # A rejoining peer moved past it (it joins from a later round) says nothing.
                stale = stale or (not ack.accepted and ack.reason == "stale" and self.node.takes_part(p, r))
            except PeerError as e:
                self.node.mark_dead(p, f"push failed: {e.status}")
                failed.append(p)
            except TimeoutError:
                self.node.mark_dead(p, "push timed out")
                failed.append(p)
        return stale, failed

    def _await_ack(self, peer: str, fut: Future, deadline: float) -> PushResult | None:
        """The push's answer; None once the peer is dropped meanwhile. A partitioned peer never
        answers, so the wait looks at the control plane's notices between short slices."""
        while True:
            left = deadline - time.monotonic()
            try:
                return fut.result(timeout=max(0.1, min(left, GONE_CHECK_S)))
            except TimeoutError:
                if left <= GONE_CHECK_S:
                    raise
                self.node.take_lost_notices()
                if not self.node.is_alive(peer):
                    return None

    def _all_to_all(
        self,
        r: int,
        x: Tensor,
        weight: float,
        fingerprint: str,
        step: int,
        participants: list[str],
        deadline: float,
    ) -> Reduced:
        stream = self.stream
        enc, decoded, residual = self.own.compress(x)
        opened_at, step_s = self.figures
        meta = Meta(
            self.me, stream, r, weight, fingerprint=fingerprint, step=step, step_s=step_s, opened_at=opened_at
        )
        msg = OutMessage(meta, [("x", enc)])
        timeout = max(0.1, deadline - time.monotonic())
        pushes = {p: self._send(p, msg, timeout) for p in participants}
        for fut in pushes.values():
            fut.add_done_callback(lambda _: self.node.poke())

        def done(p: str) -> bool:
            # It answered that it has its result of the round already (its ring completed before
            # it saw the ring break, or it applied the round): its contribution will not come.
            fut = pushes[p]
            if not fut.done() or fut.cancelled() or fut.exception() is not None:
                return False
            ack = fut.result()
            return not ack.accepted and ack.reason in ("done", "stale")

        got = self.node.collect(stream, r, participants, deadline, mark_missing=False, done=done)
        stale, failed = self._acks(pushes, deadline, r)
        for p in participants:
            if p not in got and p not in failed:
                self.node.probe(p)
        contrib = {self.me: (decoded, weight)} | {s: (m.tensors["x"], m.meta.weight) for s, m in got.items()}
        order = sorted(contrib)
        avg = weighted_mean([contrib[s][0] for s in order], [contrib[s][1] for s in order])
        self.own.commit(residual)
        fps = {self.me: fingerprint} | {s: m.meta.fingerprint for s, m in got.items()}
        figs = {self.me: self.figures} | {s: (m.meta.opened_at, m.meta.step_s) for s, m in got.items()}
        return Reduced(avg, fps, ring=False, stale=stale, members=order, figures=figs)

    def _hop(self, members: list[str], phase: str, k: int) -> ErrorFeedback:
        # The chunk a region sends at a given hop is fixed by the ring and the hop, so the residual
        # of that hop is the one to carry into the same hop of the next round.
        key = f"{phase}{k}:{','.join(members)}"
        if key not in self.hops:
            self.hops[key] = self._ef()
        return self.hops[key]

    def _ring(
        self,
        r: int,
        x: Tensor,
        weight: float,
        fingerprint: str,
        step: int,
        members: list[str],
        deadline: float,
    ) -> Reduced:
        out, fps, figs, _, stale = self._ring_sum(
            r, x * weight, weight, f"{self.me}={fingerprint}", step, members, deadline, ""
        )
        return Reduced(out, fps, ring=True, stale=stale, members=members, figures=figs)

    def _ring_sum(
        self,
        r: int,
        xw: Tensor,
        weight: float,
        origin: str,
        step: int,
        members: list[str],
        deadline: float,
        tier: str,
    ) -> tuple[Tensor, dict[str, str], dict[str, tuple[float, float]], list[EncodedTensor], bool]:
        """The ring over ``members`` of weighted sums ``xw`` of total ``weight``: the average, the
        fingerprints and figures of every contribution, each chunk's encoding as every member
        decoded it, and whether a peer was ahead. ``origin``: this member's contributions'
        ``name=fingerprint`` entries, joined by ';' (a head carries its group's). Each hop's chunk
        travels in parts, each passed on as soon as it is in (``pipeline``)."""
        size = len(members)
        i = members.index(self.me)
        nxt, prv = members[(i + 1) % size], members[(i - 1) % size]
        ring = _Ring(self, r, step, members, tier, xw, origin)
        sends = PushQueue(self.node.client(nxt), deadline)
        try:
            ring.start(sends, xw, weight)
            if size == 1:
                for j, part in enumerate(ring.parts[ring.own]):
                    ring.gather_own(sends, j, xw[part], weight)
            for k in range(size - 1):
                _, recv_c = reduce_scatter_step(i, k, size)
                for j, part in enumerate(ring.parts[recv_c]):
                    got = self._hop_in(f"{self.stream}.{tier}rs{k}", j, r, prv, deadline)
                    val, w = got.tensors["x"] + xw[part], got.meta.weight + weight
                    if k < size - 2:
                        ring.scatter(sends, k + 1, j, val, w)
                    else:
                        ring.gather_own(sends, j, val, w)
            for k in range(size - 1):
                _, recv_c = all_gather_step(i, k, size)
                for j, part in enumerate(ring.parts[recv_c]):
                    got = self._hop_in(f"{self.stream}.{tier}ag{k}", j, r, prv, deadline)
                    ring.gathered(sends, k, recv_c, j, part, got)
        finally:
            acks = sends.close()
        stale = self._hop_acks(acks, nxt, prv, deadline, r)
        for ef, res in ring.residuals:
            ef.commit(res)
        encs = [_joined(parts) for parts in ring.encs]
        return ring.out, ring.fps, ring.figs, encs, stale

    def _hop_in(self, stream: str, j: int, r: int, prv: str, deadline: float) -> InMessage:
        """Part ``j`` of a hop from the ring's previous region; the ring is broken without it."""
        name = stream if j == 0 else f"{stream}.{j}"
        # A live predecessor that left the ring (it counts other members for this round: one was
        # dropped or readmitted at another round) sends on the plain stream: no hop comes then.
        got = self.node.collect(name, r, [prv], deadline, mark_missing=False, give_up_on=self.stream)
        if prv not in got:
            self.node.probe(prv)
            raise RingBroken(f"ring hop {name} round {r}: {prv} missing")
        return got[prv]

    def _hop_acks(self, acks: list[Future], nxt: str, prv: str, deadline: float, r: int) -> bool:
        """Whether a peer was ahead; a failed push breaks the ring (its peer is marked dead)."""
        stale = False
        for fut in acks:
            st, failed = self._acks({nxt: fut}, deadline, r)
            if failed:
                raise RingBroken(f"ring round {r}: push to {nxt} failed")
            stale = stale or st
        return stale

    def _hierarchical(
        self,
        r: int,
        x: Tensor,
        weight: float,
        fingerprint: str,
        step: int,
        groups: list[list[str]],
        deadline: float,
    ) -> Reduced:
        """One hierarchical round: a member pushes to its group's head and waits for the result; a
        head gathers its members, rings with the other heads and answers its members."""
        group = next(g for g in groups if self.me in g)
        heads = [g[0] for g in groups]
        members = [p for g in groups for p in g]
        origin = _entry(self.me, fingerprint, self.figures)
        if self.me != group[0]:
            return self._hierarchical_member(r, x, weight, origin, step, group, len(heads), members, deadline)
        return self._hierarchical_head(r, x, weight, origin, step, group, heads, members, deadline)

    def _hierarchical_member(
        self,
        r: int,
        x: Tensor,
        weight: float,
        origin: str,
        step: int,
        group: list[str],
        n_heads: int,
        members: list[str],
        deadline: float,
    ) -> Reduced:
        head = group[0]
        up, down = f"{self.stream}.up", f"{self.stream}.down"
        ef = self._hop(group, "up", 0)
        enc, _, res = ef.compress(x * weight)
        push = self._send(
            head,
            OutMessage(Meta(self.me, up, r, weight, fingerprint=origin, step=step), [("x", enc)]),
            max(0.1, deadline - time.monotonic()),
        )
        got = self.node.collect(down, r, [head], deadline, mark_missing=False, give_up_on=self.stream)
        stale, failed = self._acks({head: push}, deadline, r)
        if head not in got and head not in failed:
            self.node.probe(head)
        if failed or head not in got:
            raise RingBroken(f"hierarchical {self.stream} round {r}: head {head} missing")
        ef.commit(res)
        msg = got[head]
        out = torch.cat([msg.tensors[f"c{k}"] for k in range(n_heads)])
        fps: dict[str, str] = {}
        figs: dict[str, tuple[float, float]] = {}
        _parse_origin(msg.meta.fingerprint, fps, figs)
        return Reduced(out, fps, ring=True, stale=stale, members=members, figures=figs)

    def _hierarchical_head(
        self,
        r: int,
        x: Tensor,
        weight: float,
        origin: str,
        step: int,
        group: list[str],
        heads: list[str],
        members: list[str],
        deadline: float,
    ) -> Reduced:
        up, down = f"{self.stream}.up", f"{self.stream}.down"
        others = group[1:]
        got = self.node.collect(up, r, others, deadline, mark_missing=False, give_up_on=self.stream)
        missing = [p for p in others if p not in got]
        for p in missing:
            self.node.probe(p)
        if missing:
            raise RingBroken(f"hierarchical {self.stream} round {r}: {missing} missing")
        # Members in the group's order: the partial sum does not depend on arrival order.
        xw, w = x * weight, weight
        for p in others:
            xw = xw + got[p].tensors["x"]
            w += got[p].meta.weight
        origin = ";".join([origin, *(got[p].meta.fingerprint for p in others)])
        out, fps, figs, encs, stale = self._ring_sum(r, xw, w, origin, step, heads, deadline, "h")
        if others:
            every = ";".join(_entry(k, v, figs[k]) for k, v in fps.items())
            meta = Meta(self.me, down, r, w, fingerprint=every, step=step)
            msg = OutMessage(meta, [(f"c{k}", e) for k, e in enumerate(encs)])
            timeout = max(0.1, deadline - time.monotonic())
            # The heads have completed the round: a member that misses its result is dropped
            # (``_acks``) and rejoins as a late peer does, rather than breaking the others' round.
            st, _ = self._acks({p: self._send(p, msg, timeout) for p in others}, deadline, r)
            stale = stale or st
        return Reduced(out, fps, ring=True, stale=stale, members=members, figures=figs)

    # ------------------------------------------------------------ checkpoint

    def state_dict(self) -> dict[str, object]:
        return {"own": self.own.state_dict(), "hops": {k: ef.state_dict() for k, ef in self.hops.items()}}

    def load_state_dict(self, state: dict[str, object]) -> None:
        self.own.load_state_dict(state.get("own", {}))  # type: ignore[arg-type]
        self.hops = {}
        for k, s in dict(state.get("hops", {})).items():  # type: ignore[call-overload]
            self.hops[k] = self._ef()
            self.hops[k].load_state_dict(s)


def _joined(parts: list[EncodedTensor]) -> EncodedTensor:
    """A chunk's encoding from its parts' (each part's chunks at its offset within the chunk)."""
    out = EncodedTensor(parts[0].codec, sum(p.numel for p in parts))
    base = 0
    for p in parts:
        out.chunks.extend(replace(c, offset=c.offset + base) for c in p.chunks)
        base += p.numel
    return out


class _Ring:
    """One ring round's state in a region: the chunks and their parts, what it sends on, and what
    it has gathered (the average, each part's encoding, fingerprints and figures)."""

    def __init__(
        self,
        red: DenseReducer,
        r: int,
        step: int,
        members: list[str],
        tier: str,
        xw: Tensor,
        origin: str,
    ) -> None:
        self.red, self.r, self.step, self.members, self.tier = red, r, step, members, tier
        size = len(members)
        i = members.index(red.me)
        self.chunks = fragment_slices(xw.numel(), size)
        self.parts = [part_slices(c, xw.numel() // size) for c in self.chunks]
        self.own = owned_chunk(i, size)
        self.out = torch.empty_like(xw)
        self.encs: list[list[Any]] = [[None] * len(p) for p in self.parts]
        self.residuals: list[tuple[ErrorFeedback, Tensor | None]] = []
        self.origin = origin
        self.fps: dict[str, str] = {}
        self.figs: dict[str, tuple[float, float]] = {red.me: red.figures}
        _parse_origin(origin, self.fps, self.figs)

    def _ef(self, phase: str, k: int, j: int) -> ErrorFeedback:
        # Part 0 keeps the hop's key of whole-chunk hops (its residual in older checkpoints).
        return self.red._hop(self.members, f"{self.tier}{phase}" if j == 0 else f"{self.tier}{phase}.{j}.", k)

    def _stream(self, phase: str, k: int, j: int) -> str:
        name = f"{self.red.stream}.{self.tier}{phase}{k}"
        return name if j == 0 else f"{name}.{j}"

    def start(self, sends: PushQueue, xw: Tensor, weight: float) -> None:
        """The reduce-scatter's first hop: this region's own chunk, part by part."""
        size = len(self.members)
        if size > 1:
            send_c, _ = reduce_scatter_step(self.members.index(self.red.me), 0, size)
            for j, part in enumerate(self.parts[send_c]):
                self.scatter(sends, 0, j, xw[part], weight)

    def scatter(self, sends: PushQueue, k: int, j: int, x: Tensor, w: float) -> None:
        """Send part ``j`` of the reduce-scatter's hop ``k``: a running sum of total weight ``w``."""
        ef = self._ef("rs", k, j)
        enc, _, res = ef.compress(x)
        self.residuals.append((ef, res))
        meta = Meta(self.red.me, self._stream("rs", k, j), self.r, w, step=self.step)
        sends.put(OutMessage(meta, [("x", enc)]))

    def gather_own(self, sends: PushQueue, j: int, x: Tensor, w: float) -> None:
        """Part ``j`` of the chunk this region holds fully summed: averaged, encoded once, kept,
        and sent on the all-gather's first hop."""
        ef = self._ef("ag", 0, j)
        enc, decoded, res = ef.compress(x / w)
        self.residuals.append((ef, res))
        self.out[self.parts[self.own][j]] = decoded
        self.encs[self.own][j] = enc
        if len(self.members) > 1:
            opened_at, step_s = self.red.figures
            meta = Meta(
                self.red.me, self._stream("ag", 0, j), self.r,
                fingerprint=self.origin, step=self.step, step_s=step_s, opened_at=opened_at,
            )  # fmt: skip
            sends.put(OutMessage(meta, [("x", enc)]))

    def gathered(self, sends: PushQueue, k: int, c: int, j: int, part: slice, got: InMessage) -> None:
        """Part ``j`` of chunk ``c`` arrived on the all-gather's hop ``k``: kept, and its bytes
        forwarded as received (every region decodes the same), with its origin's figures."""
        self.out[part] = got.tensors["x"]
        m = got.meta
        if j == 0:
            region = _parse_origin(m.fingerprint, self.fps)
            self.figs[region] = (m.opened_at, m.step_s)
            _parse_origin(m.fingerprint, self.fps, self.figs)
        enc = got.encoded["x"]
        self.encs[c][j] = enc
        if k < len(self.members) - 2:
            meta = Meta(
                self.red.me, self._stream("ag", k + 1, j), self.r,
                fingerprint=m.fingerprint, step=self.step, step_s=m.step_s, opened_at=m.opened_at,
            )  # fmt: skip
            sends.put(OutMessage(meta, [("x", enc)]))
