"""Which of a sync config's addresses reach beyond this host: without TLS the engine refuses them
unless the config says ``insecure`` (``training.sync.engine``)."""

from __future__ import annotations

import ipaddress
import logging

from contracts.errors import FailedPrecondition
from contracts.sync_config import SyncConfig

log = logging.getLogger(__name__)
_warned = False  # one warning per process: every stage's engine of a participant shares the choice


def is_loopback(address: str) -> bool:
    """``host:port`` (``[v6]:port`` too) names this host only: localhost or a loopback IP."""
    host = address.rpartition(":")[0].strip("[]") if ":" in address else address
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name other than localhost may resolve anywhere
        return False


def off_loopback(cfg: SyncConfig) -> list[str]:
    """The addresses this leader serves on, advertises or calls that leave the host. A peer whose
    address comes from the rendezvous directory published it from its own config, which its own
    engine checks the same way."""
    listen = cfg.listen or "127.0.0.1:0"
    named = [listen] + ([cfg.advertise] if cfg.advertise else []) + [a for a in cfg.peers.values() if a]
    return [a for a in named if not is_loopback(a)]


def has_tls(cfg: SyncConfig) -> bool:
    return bool(cfg.tls_ca_pem and cfg.tls_cert_pem and cfg.tls_key_pem)


def check_exposure(cfg: SyncConfig) -> None:
    """Refuse a plaintext engine that reaches beyond this host unless ``cfg.insecure``; warn once
    per process where it is allowed to."""
    global _warned
    if has_tls(cfg):
        return
    exposed = off_loopback(cfg)
    if not exposed:
        return
    if not cfg.insecure:
        raise FailedPrecondition(
            f"sync without TLS would serve or call {exposed} in plaintext: give tls_ca_pem, "
            "tls_cert_pem and tls_key_pem (and auth_secret), keep every address on loopback, or set "
            "insecure=True to run unencrypted anyway",
            field="sync.insecure",
        )
    if not _warned:
        _warned = True
        what = "unauthenticated and unencrypted" if not cfg.auth_secret else "unencrypted"
        log.warning("sync runs %s (insecure=True) over %s", what, ", ".join(exposed))
