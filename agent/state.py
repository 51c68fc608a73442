"""The agent's state file: node credentials (so a restarted agent keeps its node) and the process
groups of running workers (so a restarted agent can stop workers its predecessor left behind)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class Credentials:
    server: str
    region: str
    cluster: str
    node_id: str
    node_token: str
    cluster_id: str = ""

    def fits(self, server: str, region: str, cluster: str) -> bool:
        """Credentials only stand for the node they were issued to: same control plane, region and
        cluster. A control plane is a list of replica addresses: listing one more replica (or one
        fewer) is the same control plane as long as an address is shared."""
        same_plane = bool(set(self.server.split(",")) & set(server.split(",")))
        return same_plane and (self.region, self.cluster) == (region, cluster)


@dataclass
class AgentState:
    credentials: Credentials | None = None
    # assignment_id -> {"pgid": int, "dir": str}
    workers: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def load(cls, path: Path) -> AgentState:
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError) as exc:
            raise ValueError(
                f"state file {path} is unreadable ({exc}); remove it to register afresh"
            ) from exc
        creds = raw.get("credentials")
        return cls(
            credentials=Credentials(**creds) if creds else None, workers=dict(raw.get("workers") or {})
        )

    def save(self, path: Path) -> None:
        """Write atomically, readable by the owner only (it holds a credential)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {
            "credentials": asdict(self.credentials) if self.credentials else None,
            "workers": self.workers,
        }
        tmp = path.with_name(path.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2, sort_keys=True)
        os.replace(tmp, path)
