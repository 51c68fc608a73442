"""``SyncEngine``: the train loop's cross-region hook (``training.sync_protocol.CrossRegionSync``),
built by ``create_engine`` (a user's loop) or ``create_sync`` (a worker, through it).

Built on every rank; only the leader opens a server and talks to peer leaders. The leader's first
event is a join: it waits for the peers, and if they are ahead (this region restarted, or resumed
from an older checkpoint) it catches up from a peer's state before it trains on. A region found
to have fallen behind or drifted later catches up the same way.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from contracts.errors import FailedPrecondition, InvalidArgument
from contracts.sync_config import ANCHORED_MODES, SyncConfig
from training.sync.algorithms.round_plan import RoundPlan
from training.sync.algorithms.schedule import anchored_event, is_start
from training.sync.exposure import check_exposure, has_tls
from training.sync.node import RegionNode
from training.sync.stats import goodput_fraction
from training.sync.strategies.anchored import AnchoredSync
from training.sync.strategies.async_ps import AsyncServer
from training.sync.strategies.base import Strategy
from training.sync.strategies.gossip import GossipSync
from training.sync.strategies.grad import GradSync
from training.sync.strategies.ssp import StaleSync
from training.sync.transport import PeerError

if TYPE_CHECKING:
    from contracts.worker_config import WorkerConfig
    from training.sync_protocol import SyncContext

log = logging.getLogger(__name__)

STRATEGIES: dict[str, type[Strategy]] = {
    "sync": GradSync,
    "local_sgd": AnchoredSync,
    "diloco": AnchoredSync,
    "ssp": StaleSync,
    "async": AsyncServer,
    "gossip": GossipSync,
}


def is_event(cfg: SyncConfig, step: int, total_steps: int) -> bool:
    """Pure function of the step: every rank takes part in the gather/scatter when True."""
    if cfg.mode == "sync":  # gradients every step; parameters only checked at both ends
        return step == 1 or step == total_steps
    if cfg.mode in ("local_sgd", "diloco"):
        return anchored_event(step, cfg.round_steps, cfg.delay_steps, total_steps)
    return step == 1 or step == total_steps or is_start(step, cfg.every)


LEAVE_WAIT_S = 5.0  # the most a finished region waits for its live peers to leave too


class SyncEngine:
    """Cross-region sync for any training loop (public API, exported by ``training.sync``; build it
    with ``create_engine``, see ``docs/sync.md``).

    Only the leader (``is_leader``) opens a server and talks to peer leaders. Each step, on the
    leader:

        if engine.syncs_gradients(step):      # mode "sync": before the optimizer step
            engine.reduce_gradients(step, grads)
        ...optimizer step...
        if engine.should_sync(step):
            engine.after_step(step, params)   # in place
        engine.metrics()

    for ``step`` up to ``engine.local_steps(total_steps)`` (balanced rounds change it), and
    ``close()`` at the end. ``examples/sync_regions.py`` runs one per mode.
    """

    def __init__(
        self,
        cfg: SyncConfig,
        *,
        region: str,
        is_leader: bool,
        total_steps: int,
        weight: float,
        theta0: Tensor | None,
    ) -> None:
        if cfg.mode not in STRATEGIES:
            raise InvalidArgument(
                f"sync.mode {cfg.mode!r} has no engine; expected one of {sorted(STRATEGIES)}",
                field="sync.mode",
            )
        if cfg.land_on_arrival is None or cfg.balance is None:
            raise InvalidArgument(
                "the engine takes a complete sync config (land_on_arrival and balance set): build it "
                "with training.sync.create_engine",
                field="sync",
            )
        if cfg.region is not None and cfg.region != region:
            raise InvalidArgument(
                f"sync.region {cfg.region!r} differs from the worker's region {region!r}", field="sync.region"
            )
        if total_steps < 1:
            raise InvalidArgument(f"total_steps must be >= 1, got {total_steps}", field="total_steps")
        self.cfg, self.region, self.is_leader, self.total_steps = cfg, region, is_leader, total_steps
        self.theta0 = theta0
        self.joined = False
        self.caught_up_step = 0  # the step of the peer this region last took its state from
        self.blocked_s = 0.0
        self.waited_s = 0.0  # every second spent in sync calls, never reset (balancing's clock)
        self.node: RegionNode | None = None
        self.strategy: Strategy | None = None
        self.finished_at: int | None = None  # balanced: the step this region's final round opened at
        if is_leader:
            regions = sorted(set(cfg.peers) | {region})
            if len(regions) < 2:
                raise InvalidArgument("sync needs at least one peer region in sync.peers", field="sync.peers")
            check_exposure(cfg)
            self.node = RegionNode(cfg, region, regions)
            self.strategy = STRATEGIES[cfg.mode](self.node, cfg, weight, total_steps)
            self.node.strategy = self.strategy
            if isinstance(self.strategy, AnchoredSync):
                self.strategy.on_arrival = cfg.land_on_arrival and bool(cfg.overlap)
                # Balanced rounds move round ends off the fixed schedule, which only a region whose
                # leader is its one process can follow (the config requires landing on arrival).
                if cfg.balance:
                    self.strategy.plan = RoundPlan(region, cfg.round_steps, total_steps)
                    log.info(
                        "sync %s: balanced rounds (balance=True): region %s trains "
                        "engine.local_steps(%d) steps, which follow its speed",
                        cfg.mode,
                        region,
                        total_steps,
                    )
            self.node.start()

    @property
    def address(self) -> str:
        assert self.node is not None
        return self.node.address

    # ------------------------------------------------------------ hook

    def should_sync(self, step: int) -> bool:
        self._check_within_plan(step)
        # Landing on arrival moves a round's landing off the fixed schedule; only the leader knows
        # when its result is in, so the engine does it only where the leader is the region's one
        # process. The fixed schedule's landing step is then no event of its own.
        s = self.strategy
        if isinstance(s, AnchoredSync) and s.plan is not None:
            return step == 1 or s.due(step) or s.opens_at(step) or s.balancing(step)
        if isinstance(s, AnchoredSync) and s.on_arrival:
            return s.due(step) or anchored_event(step, self.cfg.round_steps, 0, self.total_steps)
        return is_event(self.cfg, step, self.total_steps)

    def syncs_gradients(self, step: int) -> bool:
        return self.cfg.mode == "sync"

    def _check_within_plan(self, step: int) -> None:
        """Balanced rounds end this region's run at its own step count: a loop that runs on past it
        would train steps no round ever averages."""
        if self.finished_at is not None and step > self.finished_at:
            raise FailedPrecondition(
                f"sync: region {self.region}'s balanced rounds ended at step {self.finished_at} and the "
                f"loop is at step {step}: with balance=True each region trains "
                f"engine.local_steps({self.total_steps}) steps (its share follows its speed); loop up to "
                "that, or set balance=False to train the same steps in every region",
                field="sync.balance",
            )

    @property
    def plan(self) -> RoundPlan | None:
        return self.strategy.plan if isinstance(self.strategy, AnchoredSync) else None

    def local_steps(self, planned: int) -> int:
        """This region's step count: balanced rounds make it follow the region's speed. Once its
        final round has opened, that step is the count: a re-split that reaches the plan after the
        final round opened must not move the end past it (``_check_within_plan`` holds the loop
        to it)."""
        if self.plan is None:
            return planned
        return self.finished_at if self.finished_at is not None else self.plan.local_steps()

    def job_step(self, step: int) -> float:
        """Where ``step`` is on the job's fixed step axis (the learning-rate schedule's)."""
        return float(step) if self.plan is None else self.plan.job_step(step)

    @torch.no_grad()
    def reduce_gradients(self, step: int, grads: list[Tensor]) -> None:
        """``sync`` mode, before the optimizer step: replace the cluster's gradients (leader: full
        replica, CPU, canonical order) with their weighted average over the regions, in place."""
        if self.cfg.mode != "sync":
            raise FailedPrecondition(
                f"reduce_gradients is the 'sync' mode's hook; mode {self.cfg.mode!r} syncs parameters "
                "in after_step (engine.syncs_gradients(step) says when to call it)",
                field="sync.mode",
            )
        if not self.is_leader or not grads:
            return
        assert isinstance(self.strategy, GradSync)
        t0 = time.monotonic()
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        if not self.joined:
            self.strategy.start(flat, self.theta0)
            self._meet(step, fresh=True)
            assert self.node is not None
            self.node.hello_all(
                ready=True, next_round=step, step=step, deadline=time.monotonic() + self.cfg.timeout_s
            )
            self.joined = True
        avg = self.strategy.reduce(step, flat)
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(avg[offset : offset + n].view_as(g))
            offset += n
        self.blocked_s += time.monotonic() - t0

    @torch.no_grad()
    def after_step(self, step: int, model_params: list[Tensor]) -> None:
        if not self.is_leader or not model_params:
            return
        assert self.strategy is not None
        self._check_within_plan(step)
        if isinstance(self.strategy, GradSync) and self.strategy.completed != step:
            raise FailedPrecondition(
                f"sync: step {step} took its optimizer step on this region's own gradients; mode "
                "'sync' averages gradients, not parameters: call engine.reduce_gradients(step, grads) "
                "after backward and before the optimizer step wherever engine.syncs_gradients(step)",
                field="sync.mode",
            )
        t0 = time.monotonic()
        if isinstance(self.strategy, AnchoredSync):
            self.strategy.tick(step, t0, time.time(), self.waited_s)
        flat = torch.cat([p.reshape(-1).float() for p in model_params])
        changed = False
        if not self.joined:
            self.strategy.start(flat, self.theta0)
            if self.theta0 is None and isinstance(self.strategy, AnchoredSync):
                # No common initialisation given: every region starts from the lowest-named
                # region's anchor before its first round (its local progress is kept).
                self.strategy.repair_from = min(self.node.regions)  # type: ignore[union-attr]
            new = self._join(step, flat, fresh=True)
            changed = new is not flat
            flat = new
        elif self.strategy.needs_catch_up:
            flat = self._join(step, flat, fresh=False)
            changed = True
        out = self.strategy.on_event(step, flat)
        if out is not None:
            flat, changed = out, True
        plan = self.plan
        if (
            plan is not None
            and isinstance(self.strategy, AnchoredSync)
            and self.strategy.opened >= plan.rounds
        ):
            self.finished_at = step
        if changed:
            offset = 0
            for p in model_params:
                n = p.numel()
                p.copy_(flat[offset : offset + n].view_as(p))
                offset += n
        self.blocked_s += time.monotonic() - t0
        self.waited_s += time.monotonic() - t0

    def _meet(self, step: int, fresh: bool) -> dict[str, Any]:
        """Ask every peer for its status; a fresh start waits until every reachable one is ready."""
        assert self.node is not None
        node = self.node
        deadline = time.monotonic() + (self.cfg.startup_timeout_s if fresh else self.cfg.timeout_s)
        statuses = node.hello_all(ready=False, next_round=0, step=step, deadline=deadline)
        while fresh and not all(st.ready for st in statuses.values()) and time.monotonic() < deadline:
            time.sleep(0.05)  # start together: wait until every reachable peer is at its first event
            statuses = node.hello_all(ready=False, next_round=0, step=step, deadline=deadline)
        return statuses

    def _join(self, step: int, flat: Tensor, fresh: bool) -> Tensor:
        """Meet the peers; catch up from the most advanced one if it is ahead of us."""
        assert self.node is not None and self.strategy is not None
        s, node = self.strategy, self.node
        s.needs_catch_up = False
        statuses = self._meet(step, fresh)
        repair = getattr(s, "repair_from", None)
        s.repair_from = None  # type: ignore[attr-defined]
        late: dict[str, Any] = {}
        for _attempt in range(5):
            _, completed = s.progress()
            src, min_round = None, 0
            if repair is not None and repair != self.region:
                src, min_round = repair, completed  # its state once it has applied what we have
            elif late:  # they opened our next round already: wait for it to complete, take that
                src = max(late, key=lambda p: (late[p].progress, p))
                # Its state once the rounds before the one it includes us from are completed:
                # those need nothing from us. Its progress may be past that round by now (it
                # opened the round after answering), and that round waits for our contribution,
                # so waiting for its progress would wait out both its timeout and ours.
                told = late[src]
                min_round = told.include_from if told.accepted else told.progress
            else:
                ahead = {p: st for p, st in statuses.items() if st.ready and st.completed > completed}
                hint = s.catch_up_source(statuses) if hasattr(s, "catch_up_source") else None
                if hint in ahead:
                    src, min_round = hint, ahead[hint].completed
                elif ahead:
                    src = max(ahead, key=lambda p: (ahead[p].completed, p))
                    min_round = ahead[src].completed
            repair = None
            if src is not None:
                try:
                    state = node.client(src).pull("state", min_round, timeout=self.cfg.timeout_s)
                    flat = s.adopt(state, flat)
                    # The step of the state taken (its round counter is as of then), not the step
                    # the peer reported earlier: it may have opened another round in between.
                    peer = late.get(src) or statuses.get(src)
                    if self.plan is None:  # balanced: the plan restarts at our own step instead
                        self.caught_up_step = max(
                            self.caught_up_step, state.meta.step or (peer.step if peer else 0)
                        )
                except PeerError as e:
                    node.mark_dead(src, f"catch-up failed: {e.status}")
            opened, _ = s.progress()
            replies = node.hello_all(
                ready=True, next_round=opened, step=step, deadline=time.monotonic() + self.cfg.timeout_s
            )
            # A peer that opened our next round already includes us from a later one: we have
            # nothing to give to the rounds before it. Every peer is told that round first, so
            # none waits for us in the rounds before it (it would wait out a timeout), then we take
            # the state once they are completed and contribute from there.
            target = max((st.include_from for st in replies.values() if st.accepted), default=opened)
            if target > opened:
                replies = node.hello_all(
                    ready=True, next_round=target, step=step, deadline=time.monotonic() + self.cfg.timeout_s
                )
            late = {p: st for p, st in replies.items() if not st.accepted or st.include_from > opened}
            if not late:
                break
        if fresh:
            self._await_decided(step)
        self.joined = True
        return flat

    def _await_decided(self, step: int) -> None:
        """Starting together, second half: run on only once every peer still at its first event
        (step 0: it has run none) has decided its join (its ready hello reached us). Leaving as soon
        as every peer is ready is not enough: without a round barrier (gossip) the first region out
        could complete a round before a slower one looks again, which would then take it for ahead
        and catch up from it, its rounds one event off its steps."""
        assert self.node is not None
        node = self.node
        deadline = time.monotonic() + self.cfg.startup_timeout_s
        while time.monotonic() < deadline:
            statuses = node.hello_all(ready=False, next_round=0, step=step, deadline=deadline)
            with node.cv:
                undecided = [p for p, st in statuses.items() if st.step == 0 and p not in node.decided]
            if not any(node.is_alive(p) for p in undecided):
                return
            time.sleep(0.05)

    def metrics(self) -> dict[str, Any]:
        if not self.is_leader or self.node is None or self.strategy is None:
            return {}
        t = self.node.stats.take()
        lat = self.strategy.take_latencies()
        comm = sum(lat)
        blocked_comm = self.strategy.blocked_on_comm
        self.strategy.blocked_on_comm = 0.0
        out: dict[str, Any] = {
            "bytes_sent": t["bytes_sent"],
            "bytes_recv": t["bytes_recv"],
            # Read the kernel after a step that sent (before a peer can close the connection and
            # take its counters with it), else at most once a second.
            **self._wire(force=sum(t["bytes_sent"].values()) > 0),
            "blocked_s": self.blocked_s,
            "overlapped_s": max(0.0, comm - blocked_comm),
            "alive": [p for p in self.node.peers if self.node.is_alive(p)],
        }
        if isinstance(self.strategy, AnchoredSync) and self.cfg.overlap:
            # Steps from the opening to the applying of the last overlapped round (landing on
            # arrival: as the exchange took), else the fixed delay.
            out["overlap_steps"] = self.strategy.last_lag or self.strategy.delay
            if self.strategy.landings:  # overlapped rounds applied at this step: steps since opening
                out["landed_after_steps"] = [lag for _, lag, _ in self.strategy.landings]
                out["landed_waiting"] = [waited for _, _, waited in self.strategy.landings]
                self.strategy.landings = []
        if isinstance(self.strategy, AnchoredSync) and self.strategy.splits:
            out["round_split"] = self.strategy.splits[-1]  # steps per region of the round re-split latest
            self.strategy.splits = []
        if lat:
            out["latency_s"] = comm / len(lat)
            out["exchanges"] = len(lat)
        if isinstance(self.strategy, GossipSync):
            spread = self.strategy.take_spread()
            if spread is not None:
                out["gossip_spread"] = spread
        if isinstance(self.strategy, StaleSync) and self.strategy.ahead:
            out["ssp_ahead"] = max(self.strategy.ahead)
            self.strategy.ahead = []
        if isinstance(self.strategy, AsyncServer) and self.strategy.lag_rounds:
            out["async_lag_rounds"] = max(self.strategy.lag_rounds)
            self.strategy.lag_rounds = []
        identical = getattr(self.strategy, "identical", None)
        if identical is not None:
            out["replicas_identical"] = identical
            self.strategy.identical = None  # type: ignore[attr-defined]
        if t["transfers"]:
            out["transfers"] = [[n, round(sec, 6), rate] for n, sec, rate in t["transfers"]]
            g = goodput_fraction(t["transfers"])
            if g is not None:
                out["goodput_fraction"] = g
        ev = self.node.take_events()
        if ev:
            out["events"] = ev
        self.blocked_s = 0.0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {} if self.strategy is None else self.strategy.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.strategy is not None:
            self.strategy.load_state_dict(state)

    def _wire(self, force: bool) -> dict[str, int]:
        """The running total of wire bytes the sync sockets sent (``training.wan.wire_count``);
        nothing where the kernel's counters cannot be read (unavailable, not 0)."""
        assert self.node is not None
        n = self.node.wire.sample(force=force)
        return {} if n is None else {"wire_bytes_sent_total": n}

    def totals(self) -> dict[str, Any]:
        """Bytes the leader sent to peer regions over the whole run, for the result (after
        ``close``, so the last exchange and leaving the peers are in them): ``wan_bytes_sent``
        counts gRPC messages (serialized plus the 5-byte prefix: what egress is priced on),
        ``wan_wire_bytes_sent`` what the kernel put on the wire (absent where unavailable).
        ``insecure`` (True) where the sync ran without TLS; ``local_steps``, with balanced rounds,
        the steps this region's share came to."""
        if self.node is None:
            return {}
        out = {"wan_bytes_sent": sum(self.node.stats.total_sent.values())}
        if not has_tls(self.cfg):
            out["insecure"] = True
        if self.plan is not None:
            out["local_steps"] = self.plan.local_steps()
        n = self.node.wire.sample(force=True)
        if n is not None:
            out["wan_wire_bytes_sent"] = n
        if self.strategy is not None and self.strategy.round_spans:
            # When each exchange opened and completed (unix s, ms-rounded): with the link's
            # counters they give each round's time against its bytes' time at the link rate.
            out["round_spans"] = [[round(a, 3), round(b, 3)] for a, b in self.strategy.round_spans]
        return out

    def close(self) -> None:
        if self.node is None or self.strategy is None:
            return
        self.strategy.finish()
        # The final exchange's sockets, before a peer that is done closes them.
        self.node.wire.sample(force=True)
        if getattr(self.strategy, "is_ps", False):
            self.node.wait_all_left(self.cfg.timeout_s)  # the others still need the server
        self.node.leave_all()
        # A peer reads its counters after its final exchange and before it leaves; closing our
        # connections before every live peer has left would take the bytes it sent on them out of
        # its reading. The final exchange ends within moments on every region, so this is short.
        self.node.wait_all_left(min(self.cfg.timeout_s, LEAVE_WAIT_S), contacted_only=True)
        self.node.wire.sample(force=True)  # every sync socket still open: the last full reading
        self.node.close()


def initial_params(cfg: WorkerConfig, names: tuple[str, ...]) -> Tensor | None:
    """The job's common initialisation (same seed in every region), flattened in the replica's
    canonical order; None for a bring-your-own model (then the anchor is the leader's params at
    its first event and a divergence is repaired from the lowest-named region)."""
    if cfg.model is None or cfg.entrypoint is not None:
        return None
    from training.models.gpt import GPT

    params = dict(GPT(cfg.model, seed=cfg.training.seed).named_parameters())
    if set(names) - set(params):
        return None
    return torch.cat([params[n].detach().reshape(-1).float() for n in names])


def create_engine(
    cfg: SyncConfig,
    *,
    total_steps: int,
    region: str | None = None,
    is_leader: bool = True,
    ranks: int = 1,
    weight: float | None = None,
    theta0: Tensor | None = None,
) -> SyncEngine:
    """The one way to build a sync engine, with a real job's defaults (``docs/sync.md``).

    ``region``: this region's name among ``cfg.peers`` (default ``cfg.region``); ``ranks``: the
    processes of this region's replica (1 in a plain loop; only rank 0 is the leader,
    ``is_leader``); ``weight``: this region's share of the job's data (default an equal share);
    ``theta0``: the job's common initial parameters, flattened (without them anchored modes start
    every region from the lowest-named region's). Landing on arrival and balanced rounds default
    to on where the region is one process, as in a real job; the engine's ``cfg`` shows them."""
    name = region or cfg.region
    if not name:
        raise InvalidArgument("create_engine needs region= or sync.region", field="sync.region")
    if ranks < 1:
        raise InvalidArgument(f"ranks must be >= 1, got {ranks}", field="ranks")
    anchored = cfg.mode in ANCHORED_MODES
    landing = cfg.land_on_arrival if cfg.land_on_arrival is not None else (anchored and ranks == 1)
    if landing and ranks > 1:
        raise InvalidArgument(
            f"land_on_arrival needs the region's leader to be its one process; this region has {ranks}",
            field="sync.land_on_arrival",
        )
    balance = cfg.balance if cfg.balance is not None else (anchored and landing)
    if balance and not landing:
        raise InvalidArgument(
            "balance=True needs land_on_arrival (balanced round ends only a region whose leader is its "
            "one process can follow): set balance=False, or run the region as one process",
            field="sync.balance",
        )
    resolved = SyncConfig.model_validate(cfg.model_dump() | {"land_on_arrival": landing, "balance": balance})
    regions = set(cfg.peers) | {name}
    return SyncEngine(
        resolved,
        region=name,
        is_leader=is_leader,
        total_steps=total_steps,
        weight=1 / len(regions) if weight is None else weight,
        theta0=theta0,
    )


def create_sync(cfg: WorkerConfig, ctx: SyncContext) -> SyncEngine:
    """A worker's engine (``training.sync_hook.build_sync``): ``create_engine`` with the worker's
    region, replica share and initialisation. The control plane asks for balanced rounds in
    round-based modes; they apply where the region is one process."""
    sc = cfg.sync
    if not isinstance(sc, SyncConfig):
        sc = SyncConfig.model_validate(sc.model_dump())
    if sc.global_replicas is None and sc.peers:
        raise FailedPrecondition(
            "sync.global_replicas is required with peers (weights of regions)", field="sync.global_replicas"
        )
    if ctx.world_size > 1 and sc.balance:
        sc = SyncConfig.model_validate(sc.model_dump() | {"balance": False})
    weight = ctx.local_replicas / (sc.global_replicas or ctx.local_replicas)
    theta0 = initial_params(cfg, ctx.param_names) if ctx.is_leader else None
    return create_engine(
        sc,
        region=cfg.region,
        is_leader=ctx.is_leader,
        ranks=ctx.world_size,
        total_steps=cfg.training.steps,
        weight=weight,
        theta0=theta0,
    )
