"""TLS for the agent service: server credentials from the operator's PEM files, and per-node client
certificates the control plane issues at enrollment when it runs a node CA (mTLS).

With ``tls_client_ca_file`` set, the agent port requires a client certificate signed by that CA,
and a node's certificate names the node (CN = node id): a stream for node X is refused unless its
certificate says X. A node without a certificate yet registers on the enrollment port (server TLS
only, nothing but Register answered there), sending a CSR; the answer carries its certificate.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from contracts.errors import FailedPrecondition, InvalidArgument
from orchestration.settings import Settings

NODE_CERT_DAYS = 365
MAX_CSR_BYTES = 16 * 1024


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise FailedPrecondition(f"{what}: cannot read {path}: {exc.strerror}", field=what) from None


@dataclass(frozen=True)
class AgentTls:
    """What the agent port needs: its own key pair, and optionally the node CA (mTLS)."""

    cert_pem: bytes
    key_pem: bytes
    client_ca_pem: bytes | None = None
    client_ca_key_pem: bytes | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> AgentTls | None:
        if settings.tls_cert_file is None or settings.tls_key_file is None:
            return None
        ca = settings.tls_client_ca_file
        ca_key = settings.tls_client_ca_key_file
        tls = cls(
            cert_pem=_read(settings.tls_cert_file, "tls_cert_file"),
            key_pem=_read(settings.tls_key_file, "tls_key_file"),
            client_ca_pem=_read(ca, "tls_client_ca_file") if ca else None,
            client_ca_key_pem=_read(ca_key, "tls_client_ca_key_file") if ca_key else None,
        )
        # Parsed now, so a bad node CA stops the start rather than failing a registration later
        # (after its enrollment token was used).
        try:
            if tls.client_ca_pem is not None:
                x509.load_pem_x509_certificate(tls.client_ca_pem)
            if tls.client_ca_key_pem is not None:
                serialization.load_pem_private_key(tls.client_ca_key_pem, password=None)
        except (ValueError, TypeError) as exc:
            raise FailedPrecondition(
                f"tls_client_ca_file / tls_client_ca_key_file: not usable PEM: {exc}"
            ) from None
        return tls

    @property
    def mutual(self) -> bool:
        return self.client_ca_pem is not None

    def server_credentials(self) -> grpc.ServerCredentials:
        """The agent port: server TLS, plus required and verified client certificates under mTLS."""
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)],
            root_certificates=self.client_ca_pem,
            require_client_auth=self.mutual,
        )

    def enrollment_credentials(self) -> grpc.ServerCredentials:
        """The enrollment port: server TLS only (a new node has no certificate yet)."""
        return grpc.ssl_server_credentials([(self.key_pem, self.cert_pem)])

    def check_can_issue(self, csr_pem: bytes) -> x509.CertificateSigningRequest:
        """A valid CSR this control plane can sign, checked before the registration changes anything."""
        if self.client_ca_pem is None or self.client_ca_key_pem is None:
            raise FailedPrecondition(
                "csr_pem: this control plane issues no node certificates (no node CA key)", field="csr_pem"
            )
        return load_csr(csr_pem)

    def issue_node_certificate(self, csr: x509.CertificateSigningRequest, node_id: str) -> bytes:
        """Sign a node's CSR with the node CA: CN = node id whatever the CSR asked, client use only."""
        assert self.client_ca_pem is not None and self.client_ca_key_pem is not None
        return issue_client_certificate(self.client_ca_pem, self.client_ca_key_pem, csr, node_id)


def load_csr(csr_pem: bytes) -> x509.CertificateSigningRequest:
    if len(csr_pem) > MAX_CSR_BYTES:
        raise InvalidArgument(f"csr_pem: at most {MAX_CSR_BYTES} bytes", field="csr_pem")
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError:
        raise InvalidArgument("csr_pem: not a PEM certificate signing request", field="csr_pem") from None
    if not csr.is_signature_valid:
        raise InvalidArgument("csr_pem: the request's signature does not verify", field="csr_pem")
    public_key = csr.public_key()
    if not isinstance(public_key, (ec.EllipticCurvePublicKey, rsa.RSAPublicKey)):
        raise InvalidArgument("csr_pem: only EC or RSA keys are accepted", field="csr_pem")
    if isinstance(public_key, rsa.RSAPublicKey) and public_key.key_size < 2048:
        raise InvalidArgument("csr_pem: RSA keys need at least 2048 bits", field="csr_pem")
    return csr


def issue_client_certificate(
    ca_pem: bytes, ca_key_pem: bytes, csr: x509.CertificateSigningRequest, common_name: str
) -> bytes:
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca.subject)
        .public_key(csr.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=NODE_CERT_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    return cert.public_bytes(serialization.Encoding.PEM)


def peer_common_name(context: grpc.aio.ServicerContext) -> str | None:
    """The CN of the client certificate the TLS layer verified for this call (None: none)."""
    names = context.auth_context().get("x509_common_name")
    return names[0].decode() if names else None
