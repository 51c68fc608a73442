"""The outer optimizer of DiLoCo / local SGD, on flat tensors."""

from __future__ import annotations

from torch import Tensor


def outer_step(
    anchor: Tensor, pseudo_grad: Tensor, momentum: Tensor | None, lr: float, mu: float, nesterov: bool = True
) -> tuple[Tensor, Tensor | None]:
    """SGD with (Nesterov) momentum on the pseudo-gradient ``anchor - mean(local params)``.

    Returns the new anchor and momentum buffer. With ``lr=1, mu=0`` the new anchor is exactly the
    average of the regions' parameters (local SGD / plain averaging).
    """
    if mu == 0:
        return anchor - lr * pseudo_grad, None
    buf = pseudo_grad.clone() if momentum is None else mu * momentum + pseudo_grad
    update = pseudo_grad + mu * buf if nesterov else buf
    return anchor - lr * update, buf


def eager_start(
    anchor: Tensor,
    snapshot: Tensor,
    momentum: Tensor | None,
    lr: float,
    mu: float,
    nesterov: bool,
    merge: str,
) -> Tensor | None:
    """Where a region trains on from while its overlapped round is in flight (``progress`` merge):
    the outer step taken with its own pseudo-gradient in place of the regions' mean, the momentum
    left as it is (eager updates, Kale et al. 2025). Its steps then run near the new anchor rather
    than at the parameters it sent, which the outer step moves far from; when the round lands,
    ``merge_late`` keeps the progress made since this start. A 6-layer model at H=20 lost 1.3 %
    held-out loss, one step late, when it trained on from what it sent; 0.2 % from here. None:
    train on from the parameters sent (``mix``, or an outer step that returns them: local SGD)."""
    if merge != "progress" or (mu == 0 and lr == 1):
        return None
    start, _ = outer_step(anchor, anchor - snapshot, momentum, lr, mu, nesterov)
    return start


def merge_late(flat: Tensor, new_anchor: Tensor, snapshot: Tensor, merge: str, mix: float) -> Tensor:
    """Parameters after an overlapped round lands, ``delay`` steps after ``snapshot`` was sent:
    "mix" is Streaming DiLoCo's merge (``mix`` of the local parameters, the rest the new anchor);
    "progress" keeps the local progress made since ``snapshot`` on top of the new anchor (the
    round's ``eager_start`` where it has one, else the parameters sent)."""
    if merge == "mix":
        return mix * flat + (1 - mix) * new_anchor
    return new_anchor + (flat - snapshot)


def weighted_mean(values: list[Tensor], weights: list[float]) -> Tensor:
    if not values or len(values) != len(weights):
        raise ValueError(f"need as many weights as values, got {len(values)} values, {len(weights)} weights")
    total = sum(weights)
    if total <= 0:
        raise ValueError("weights must sum to a positive number")
    out = values[0] * (weights[0] / total)
    for v, w in zip(values[1:], weights[1:], strict=True):
        out = out + v * (w / total)
    return out
