"""Memory-mapped token files: a flat array of uint16 or uint32 token ids, no header.

The file is mapped read-only, so many workers on one node share the page cache and nothing is
copied until a window is read.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from contracts.errors import InvalidArgument, NotFound

TokenDtype = Literal["uint16", "uint32"]


class TokenFile:
    def __init__(self, path: str | Path, dtype: TokenDtype = "uint16") -> None:
        p = Path(path)
        if not p.is_file():
            raise NotFound(f"token file not found: {p}", field="data.path", path=str(p))
        itemsize = np.dtype(dtype).itemsize
        size = p.stat().st_size
        if size == 0 or size % itemsize:
            raise InvalidArgument(
                f"token file {p} has {size} bytes, not a positive multiple of {itemsize} ({dtype})",
                field="data.dtype",
            )
        self.path = p
        self.dtype = dtype
        self.tokens = np.memmap(p, dtype=dtype, mode="r")

    def __len__(self) -> int:
        return len(self.tokens)

    def window(self, start: int, length: int) -> Tensor:
        """Tokens ``[start, start + length)`` as int64 (a copy, so the map can stay read-only)."""
        return torch.from_numpy(self.tokens[start : start + length].astype(np.int64))


def write_token_file(path: str | Path, tokens: np.ndarray | Tensor, dtype: TokenDtype = "uint16") -> Path:
    """Write ids as a flat binary file; refuses ids that do not fit the dtype."""
    arr = tokens.numpy() if isinstance(tokens, Tensor) else np.asarray(tokens)
    arr = arr.reshape(-1)
    limit = np.iinfo(dtype).max
    if arr.size and (arr.min() < 0 or arr.max() > limit):
        raise InvalidArgument(f"token ids must lie in [0, {limit}] for {dtype}", field="data.dtype")
    p = Path(path)
    arr.astype(dtype).tofile(p)
    return p
