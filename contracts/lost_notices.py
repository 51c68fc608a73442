"""Peers the control plane has judged lost, as the agent appends them to a file beside the worker
(one JSON object per line: participant, address, reason). A partitioned peer refuses nothing, so
without this a survivor learns of the loss only at its sync timeout, in every round it waits."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

MAX_LINE = 4096  # a notice is a name, an address and a reason; longer lines are not ours


@dataclass(frozen=True)
class LostNotice:
    participant: str
    address: str
    reason: str


def append_notice(path: Path, notice: LostNotice) -> None:
    """One line, written whole in one append (the reader takes only complete lines)."""
    line = json.dumps({"participant": notice.participant, "address": notice.address, "reason": notice.reason})
    with open(path, "a", encoding="utf-8") as f:
        f.write(line[: MAX_LINE - 1] + "\n")


class NoticeReader:
    """Reads each notice once, from where it stopped; a missing file means none yet."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._offset = 0

    def new(self) -> list[LostNotice]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                data = f.read(64 * MAX_LINE)
        except FileNotFoundError:
            return []
        end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
        self._offset += end
        out = []
        for raw in data[:end].splitlines():
            try:
                obj = json.loads(raw)
                out.append(
                    LostNotice(
                        str(obj["participant"]), str(obj.get("address", "")), str(obj.get("reason", ""))
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue  # a damaged line says nothing about any peer
        return out
