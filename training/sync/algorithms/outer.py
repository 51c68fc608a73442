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


def merge_late(flat: Tensor, new_anchor: Tensor, snapshot: Tensor, merge: str, mix: float) -> Tensor:
    """Parameters after an overlapped round lands, ``delay`` steps after ``snapshot`` was sent:
    "mix" is Streaming DiLoCo's merge (``mix`` of the local parameters, the rest the new anchor);
    "progress" keeps the local progress made since the snapshot on top of the new anchor."""
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
