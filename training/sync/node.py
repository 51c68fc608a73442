"""One region's leader on the WAN: its server, its clients to every peer, who is alive, and the
inbox of contributions. Requests that arrive are handed to the mode's strategy."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from contracts.errors import FailedPrecondition, InvalidArgument
from contracts.lost_notices import NoticeReader
from contracts.sync_config import SyncConfig
from proto.cpn.sync.v1 import sync_pb2
from training.sync.handler import RoundHandler
from training.sync.messages import InMessage, OutMessage, PeerStatus, PushResult
from training.sync.stats import TransferStats
from training.sync.tls import SyncTls
from training.sync.transport import PeerClient, PeerError, SyncServer
from training.wan.inet_diag import TcpSocket
from training.wan.shaper import LinkShaper
from training.wan.wire_count import WireCounter

WILDCARDS = ("0.0.0.0", "::", "[::]", "")
GONE_CHECK_S = 0.5  # how often a peer awaited in a round is checked for a refused connection


def reachable(address: str) -> str:
    """A server bound to every interface is reached at this host's address, not the wildcard."""
    host, _, port = address.rpartition(":")
    if host not in WILDCARDS:
        return address
    try:
        host = socket.gethostbyname(socket.gethostname())
    except OSError:
        host = "127.0.0.1"
    return f"{host}:{port}"


class RegionNode:
    def __init__(self, cfg: SyncConfig, region: str, regions: list[str]) -> None:
        if region not in regions:
            raise InvalidArgument(
                f"region {region!r} is not among the job's regions {regions}", field="region"
            )
        self.cfg, self.region, self.regions = cfg, region, sorted(regions)
        self.peers = [r for r in self.regions if r != region]
        self.shaper = LinkShaper(cfg.links, pace_bandwidth=not cfg.kernel_shaping)
        self.stats = TransferStats()
        self.cv = threading.Condition()
        self.alive = dict.fromkeys(self.peers, True)
        self.include_from = dict.fromkeys(self.peers, 0)
        self.left: set[str] = set()
        self.decided: set[str] = set()  # peers whose ready hello (their join decided) reached us
        self.events: list[str] = []  # membership changes, for metrics
        self.inbox: dict[tuple[str, int], dict[str, InMessage]] = defaultdict(dict)
        self.reduced: dict[str, int] = {}  # stream -> the latest round this region has reduced on it
        self.strategy: RoundHandler | None = None
        self.pool = ThreadPoolExecutor(
            max_workers=4 + 2 * len(self.peers), thread_name_prefix=f"sync-{region}"
        )
        self._clients: dict[str, PeerClient] = {}
        self.tls = (
            SyncTls(cfg.tls_ca_pem.encode(), cfg.tls_cert_pem.encode(), cfg.tls_key_pem.encode())
            if cfg.tls_ca_pem and cfg.tls_cert_pem and cfg.tls_key_pem
            else None  # a hand-run job without the control plane's credentials: plaintext
        )
        self.server = SyncServer(
            self,
            self.shaper,
            self.stats,
            cfg.listen or "127.0.0.1:0",
            auth_secret=cfg.auth_secret,
            tls=self.tls,
        )
        self.address = cfg.advertise or reachable(self.server.address)
        # What the sync connections put on the wire, from the kernel (one region leader per process).
        self.wire = WireCounter(self.is_sync_socket)
        self._resolved: dict[str, set[tuple[str, int]]] = {}
        self._checking: set[str] = set()  # peers with a liveness check in flight
        self._announced: dict[str, str] = {}  # the address each peer's hellos gave, its latest
        self._notices = NoticeReader(cfg.lost_notices) if cfg.lost_notices else None

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.server.start()
        if self.cfg.rendezvous_dir:
            d = Path(self.cfg.rendezvous_dir)
            d.mkdir(parents=True, exist_ok=True)
            tmp = d / f".{self.region}.addr.{os.getpid()}"
            tmp.write_text(self.address)
            tmp.replace(d / f"{self.region}.addr")  # atomic: readers never see half an address

    def close(self) -> None:
        for c in self._clients.values():
            c.close()
        self.server.stop(0.5)
        self.pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ peers

    def is_sync_socket(self, s: TcpSocket) -> bool:
        """A connection of the sync service with a peer region: accepted on this region's sync port
        (only peers call it) or opened to a peer's sync endpoint. The cluster's own sockets (gloo
        inside the node) and the control plane's never match."""
        if s.sport == self.server.port:
            return True
        return any((s.dst, s.dport) in self._endpoints(c.address) for c in list(self._clients.values()))

    def _endpoints(self, address: str) -> set[tuple[str, int]]:
        """The (ip, port) pairs a peer's ``host:port`` resolves to, looked up once per address."""
        got = self._resolved.get(address)
        if got is None:
            host, _, port = address.rpartition(":")
            try:
                infos = socket.getaddrinfo(host.strip("[]"), int(port), proto=socket.IPPROTO_TCP)
                got = {(str(i[4][0]), int(i[4][1])) for i in infos}
            except (OSError, ValueError):
                got = set()
            self._resolved[address] = got
        return got

    def _address(self, peer: str, deadline: float) -> str:
        addr = self.cfg.peers.get(peer, "")
        if addr:
            return addr
        if not self.cfg.rendezvous_dir:
            raise InvalidArgument(
                f"no address for region {peer!r}: set sync.peers or sync.rendezvous_dir", field="sync.peers"
            )
        path = Path(self.cfg.rendezvous_dir) / f"{peer}.addr"
        while True:
            if path.exists():
                return path.read_text().strip()
            if time.monotonic() > deadline:
                raise FailedPrecondition(
                    f"region {peer!r} never published its address in {path.parent}",
                    field="sync.rendezvous_dir",
                )
            time.sleep(0.05)

    def client(self, peer: str, deadline: float | None = None) -> PeerClient:
        c = self._clients.get(peer)
        if c is None:
            addr = self._address(peer, deadline or time.monotonic() + self.cfg.startup_timeout_s)
            c = self._clients[peer] = PeerClient(
                self.region, peer, addr, self.shaper, self.stats, self.cfg.auth_secret, self.tls
            )
        return c

    def participants(self, round_index: int) -> list[str]:
        """Peers whose contribution to ``round_index`` this region waits for."""
        with self.cv:
            return [
                p
                for p in self.peers
                if self.alive[p] and p not in self.left and self.include_from[p] <= round_index
            ]

    def takes_part(self, peer: str, round_index: int) -> bool:
        with self.cv:
            return self.include_from.get(peer, 0) <= round_index

    def mark_dead(self, peer: str, why: str) -> None:
        with self.cv:
            if self.alive.get(peer):
                self.alive[peer] = False
                self.events.append(f"drop {peer}: {why}")
                self.cv.notify_all()

    def take_lost_notices(self) -> None:
        """Drop the peers the control plane has judged lost since the last look. A notice names the
        address the peer had: a replacement already talking to us from another one is kept."""
        if self._notices is None:
            return
        for n in self._notices.new():
            if n.participant not in self.alive:
                continue
            c = self._clients.get(n.participant)
            if n.address and c is not None and c.address != n.address:
                continue
            self.mark_dead(n.participant, f"lost, per the control plane: {n.reason}")

    def check_gone(self, peer: str) -> None:
        """In the background, at most one at a time per peer: a quick hello; a peer whose
        connection is refused or reset (UNAVAILABLE) is marked dead at once."""
        if peer in self._checking:
            return
        self._checking.add(peer)

        def run() -> None:
            try:
                self.is_gone(peer)
            finally:
                self._checking.discard(peer)

        try:
            self.pool.submit(run)
        except RuntimeError:  # the pool is shut down: closing
            self._checking.discard(peer)

    def is_gone(self, peer: str, timeout: float = 2.0) -> bool:
        """True (and the peer marked dead) when a call to it fails as UNAVAILABLE: nothing
        listens at its address any more. A slow answer or any other failure says nothing."""
        req = sync_pb2.HelloRequest(sender=self.region, address=self.address, ready=False, step=0)
        client = self.client(peer)
        probed = client.address
        try:
            client.hello(req, timeout=timeout)
            return False
        except (PeerError, FailedPrecondition) as e:
            if isinstance(e, PeerError) and e.status == "UNAVAILABLE" and client.address == probed:
                self.mark_dead(peer, f"connection gone: {e.message}")
                return True
            return False

    def is_alive(self, peer: str) -> bool:
        with self.cv:
            return self.alive[peer] and peer not in self.left

    # ------------------------------------------------------------ inbox

    def deliver(self, msg: InMessage) -> None:
        with self.cv:
            self.inbox[(msg.meta.stream, msg.meta.round)][msg.meta.sender] = msg
            self.cv.notify_all()

    def mark_reduced(self, stream: str, round_index: int) -> None:
        """This region has its result of the round on ``stream``: a contribution to it that comes
        later is answered "done" (``handle_push``), so its sender waits for ours no longer."""
        with self.cv:
            self.reduced[stream] = max(round_index, self.reduced.get(stream, -1))

    def forget_reduced(self, stream: str) -> None:
        with self.cv:
            self.reduced.pop(stream, None)

    def poke(self) -> None:
        """Wake every ``collect``: what it waits for may have changed."""
        with self.cv:
            self.cv.notify_all()

    def collect(
        self,
        stream: str,
        round_index: int,
        senders: list[str],
        deadline: float,
        mark_missing: bool = True,
        give_up_on: str | None = None,
        done: Callable[[str], bool] | None = None,
    ) -> dict[str, InMessage]:
        """Wait until every sender's message for the round is in (or the deadline); take them.
        A sender still missing then is marked dead unless ``mark_missing`` is False. A sender
        whose message for the round came on ``give_up_on`` instead (it chose another way to
        reduce it), or for which ``done`` is True (it has its result without us), is not waited
        for."""
        key = (stream, round_index)
        other = (give_up_on, round_index) if give_up_on else None
        checked = time.monotonic()
        with self.cv:
            while True:
                box = self.inbox.get(key, {})
                # A rejoining peer may be moved to a later round meanwhile (it takes the state
                # after this one): it sends nothing to this round then.
                waiting = [
                    s
                    for s in senders
                    if s not in box
                    and self.alive[s]
                    and s not in self.left
                    and self.include_from[s] <= round_index
                    and (other is None or s not in self.inbox.get(other, {}))
                    and (done is None or not done(s))
                ]
                left = deadline - time.monotonic()
                if not waiting or left <= 0:
                    break
                if time.monotonic() - checked >= GONE_CHECK_S:
                    # A killed peer never sends: find it gone from its refused connection instead
                    # of waiting out the round's timeout (a slow but live peer is waited for).
                    checked = time.monotonic()
                    self.take_lost_notices()
                    for s in waiting:
                        self.check_gone(s)
                self.cv.wait(min(left, GONE_CHECK_S / 2))
            got = {s: box[s] for s in senders if s in box}
            for k in [k for k in self.inbox if k[0] == stream and k[1] <= round_index]:
                del self.inbox[k]
        for s in senders:
            if s not in got and mark_missing:
                self.mark_dead(s, f"no contribution to {stream} round {round_index} in time")
        return got

    def take_if_complete(
        self, stream: str, round_index: int, senders: list[str], take: bool = True
    ) -> dict[str, InMessage] | None:
        """Without waiting: every awaited sender's message for the round (as ``collect`` awaits
        them; a dead or departed one is not awaited), taken unless ``take`` is False; None while
        one is still missing."""
        key = (stream, round_index)
        with self.cv:
            box = self.inbox.get(key, {})
            if any(
                s not in box and self.alive[s] and s not in self.left and self.include_from[s] <= round_index
                for s in senders
            ):
                return None
            if take:
                self.inbox.pop(key, None)
            return {s: box[s] for s in senders if s in box}

    # ------------------------------------------------------------ calls out

    def hello_all(self, ready: bool, next_round: int, step: int, deadline: float) -> dict[str, PeerStatus]:
        """Ask every peer (in parallel) for its status; peers that do not answer by the deadline are
        dropped. With ``ready`` the peers include this region from ``next_round`` if they can."""
        opened, _ = self.strategy.progress() if self.strategy else (0, 0)
        req = sync_pb2.HelloRequest(
            sender=self.region,
            address=self.address,
            ready=ready,
            next_round=next_round,
            progress=opened,
            step=step,
        )

        def one(peer: str) -> PeerStatus:
            # A peer not yet up is waited for; one known dead fails at once if nothing listens
            # at its address (a replacement's own hello gives us its new one).
            return self.client(peer, deadline).hello(
                req, timeout=max(0.1, deadline - time.monotonic()), wait_for_ready=self.alive[peer]
            )

        futs = {p: self.pool.submit(one, p) for p in self.peers if p not in self.left}
        out = {}
        for p, f in futs.items():
            try:
                out[p] = f.result()
                if ready and out[p].accepted:
                    with self.cv:
                        if not self.alive[p]:  # back through our hello, before its own reached us
                            self.events.append(f"rejoin {p} from round {self.include_from[p]}")
                        self.alive[p] = True
            except (PeerError, FailedPrecondition) as e:
                self.mark_dead(p, f"hello failed: {e.message}")
        return out

    def probe(self, peer: str, timeout: float = 2.0) -> bool:
        """Is the peer's server answering? A peer that does not is marked dead."""
        req = sync_pb2.HelloRequest(sender=self.region, address=self.address, ready=False, step=0)
        client = self.client(peer)
        probed = client.address
        try:
            client.hello(req, timeout=timeout)
            return True
        except (PeerError, FailedPrecondition) as e:
            if client.address != probed:
                return True  # it came back at a new address meanwhile (its hello re-admitted it)
            self.mark_dead(peer, f"unreachable after a missed contribution: {e.message}")
            return False

    def leave_all(self) -> None:
        # Peers that left already are told too: they wait for every live peer's leave before
        # closing (``wait_all_left``), and would otherwise wait out the whole LEAVE_WAIT_S.
        for p, c in list(self._clients.items()):
            with self.cv:
                live = self.alive[p]
            if live:
                with contextlib.suppress(PeerError):  # gone already
                    c.leave("finished", timeout=2.0)

    # ------------------------------------------------------------ Handler (server side)

    def known(self, region: str) -> bool:
        return region in self.alive

    def _strategy(self) -> RoundHandler:
        if self.strategy is None:
            raise FailedPrecondition(f"region {self.region} is not ready yet", field="sync")
        return self.strategy

    def handle_push(self, msg: InMessage) -> PushResult:
        s = self._strategy()
        with self.cv:
            reduced = msg.meta.round <= self.reduced.get(msg.meta.stream, -1)
        if reduced:  # too late for our result: its sender must not wait for our contribution
            return PushResult(False, "done", s.progress()[0])
        return s.handle_push(msg)

    def handle_exchange(self, msg: InMessage) -> OutMessage:
        return self._strategy().handle_exchange(msg)

    def handle_pull(self, requester: str, what: str, min_round: int) -> OutMessage:
        if what != "state":
            raise InvalidArgument(f"unknown pull {what!r}; expected 'state'", field="what")
        return self._strategy().export_state(min_round, timeout=self.cfg.timeout_s)

    def _announce(self, peer: str, address: str) -> None:
        """A peer's hello gives the address it serves on now. Another address than the one its
        hellos gave before is another process of that region (restarted or replaced): the one we
        knew is gone, and so are its rounds in progress. It is dropped at once; waiting for its
        contributions would last a whole timeout, since our liveness checks now reach the new
        process, which answers. The new process is admitted by its ready hello, as any rejoiner."""
        with self.cv:
            before = self._announced.get(peer)
            self._announced[peer] = address
        c = self._clients.get(peer)
        if c is None:
            self._clients[peer] = PeerClient(
                self.region, peer, address, self.shaper, self.stats, self.cfg.auth_secret, self.tls
            )
        else:
            c.set_address(address)
        if before is not None and before != address:
            self.mark_dead(peer, f"restarted: it serves at {address} now, no longer at {before}")

    def handle_hello(self, req: sync_pb2.HelloRequest) -> PeerStatus:
        s = self._strategy()
        if req.address:
            self._announce(req.sender, req.address)
        opened, completed = s.progress()
        accepted = False
        if req.ready:
            with self.cv:
                self.decided.add(req.sender)
            with self.cv:  # still a participant of every round it was not dropped from
                included = (
                    self.alive[req.sender]
                    and req.sender not in self.left
                    and self.include_from[req.sender] <= req.next_round
                )
            accepted = included or s.accepts(req.next_round)
            start = req.next_round
            if not accepted and getattr(s, "admits_late", False):
                # We opened that round already without it: include it from our next one (its
                # rounds in between differ from ours and are repaired by the fingerprint check).
                accepted, start = True, opened
            if accepted:
                with self.cv:
                    was = self.alive[req.sender] and req.sender not in self.left
                    self.alive[req.sender] = True
                    self.left.discard(req.sender)
                    self.include_from[req.sender] = start
                    if not was:
                        self.events.append(f"rejoin {req.sender} from round {start}")
                    self.cv.notify_all()  # a round waiting for it may no longer need to
                s.on_peer_joined(req.sender, start)
        return PeerStatus(
            self.region,
            s.ready,
            opened,
            completed,
            s.step,
            self.cfg.mode,
            accepted,
            start if req.ready else 0,
        )

    def handle_leave(self, sender: str) -> None:
        with self.cv:
            self.left.add(sender)
            self.events.append(f"leave {sender}")
            self.cv.notify_all()

    def wait_all_left(self, timeout: float, contacted_only: bool = False) -> None:
        """Until every live peer has left, or ``timeout``. ``contacted_only``: only the peers this
        region has a connection with (one that never exchanged anything has no bytes on ours)."""
        deadline = time.monotonic() + timeout
        with self.cv:
            while any(
                self.alive[p] and p not in self.left and (not contacted_only or p in self._clients)
                for p in self.peers
            ):
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self.cv.wait(min(left, 0.5))

    def take_events(self) -> list[str]:
        with self.cv:
            ev, self.events = self.events, []
        return ev
