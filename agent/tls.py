"""The agent's side of TLS: channel credentials (verify the control plane with a CA; present the
node's certificate under mTLS) and the node's own key and certificate signing request."""

from __future__ import annotations

import os
import ssl
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def read_pem(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise ValueError(f"{what}: cannot read {path}: {exc.strerror}") from None


def channel_credentials(
    ca_pem: bytes, key_pem: bytes | None = None, cert_pem: bytes | None = None
) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem
    )


def load_or_create_key(path: Path) -> bytes:
    """The node's private key (EC P-256), made once and kept owner-readable only: it never leaves the node."""
    if path.exists():
        return read_pem(path, "node key")
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    os.replace(tmp, path)
    return pem


def certificate_request(key_pem: bytes, hostname: str) -> bytes:
    """A CSR for the node's key; the control plane names the certificate after the node id anyway."""
    key = serialization.load_pem_private_key(key_pem, password=None)
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname[:64] or "node")]))
        .sign(key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return csr.public_bytes(serialization.Encoding.PEM)


def http_verify(ca_file: Path | None) -> ssl.SSLContext | bool:
    """How the agent checks the control plane's HTTPS certificate when it fetches and uploads
    artifacts: against ``--tls-ca-file`` where given (the CA its gRPC channel trusts), else the
    system's store."""
    return ssl.create_default_context(cafile=str(ca_file)) if ca_file is not None else True


def plain_http_hosts(server: str, ca_file: Path | None) -> frozenset[str]:
    """The control plane's hosts (``--server``) where the agent speaks to it in plaintext: its
    artifact URLs may then be plain http too. With TLS (``--tls-ca-file``) none: https only."""
    if ca_file is not None:
        return frozenset()
    return frozenset(part.rsplit(":", 1)[0].strip("[]") for part in server.split(",") if part)
