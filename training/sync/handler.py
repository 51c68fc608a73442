"""What a region's node asks of the mode's strategy when a peer calls in.

The node (``training.sync.node``) serves the wire and the strategies (``training.sync.strategies``)
drive rounds through the node, so the node knows a strategy only through this protocol.
"""

from __future__ import annotations

from typing import Protocol

from training.sync.messages import InMessage, OutMessage, PushResult


class RoundHandler(Protocol):
    def progress(self) -> tuple[int, int]:
        """(rounds opened, rounds completed)."""
        ...

    def accepts(self, next_round: int) -> bool: ...

    def on_peer_joined(self, peer: str, next_round: int) -> None: ...

    def handle_push(self, msg: InMessage) -> PushResult: ...

    def handle_exchange(self, msg: InMessage) -> OutMessage: ...

    def export_state(self, min_round: int, timeout: float) -> OutMessage: ...
