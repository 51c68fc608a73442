"""Per-job TLS credentials: the cross-region sync service (mutual TLS between a job's leaders),
and the same job CA for the job's checkpoint copies between agents (``checkpoint_credentials``)
and the rendezvous of its torchrun groups that span nodes (``group_credentials``).

Every job has its own CA. Its key is derived from the server secret and the job id, so every
replica, and every attempt of the job, signs with the same CA without storing it: a region re-placed
mid-job is trusted by the survivors, and a leader of another job (another CA) is refused at the
handshake. Each leader gets a fresh key and a certificate naming the service (``SERVER_NAME``),
not a host: leaders are reached by address and move between nodes. The assignment carries them
over the agent stream, which is TLS itself where the operator configured it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from contracts.checkpoint_transfer import checkpoint_server_name
from contracts.sync_config import GROUP_TLS_SERVER_NAME, SYNC_TLS_SERVER_NAME

SERVER_NAME = SYNC_TLS_SERVER_NAME
CA_VALID_FROM = dt.datetime(2025, 1, 1, tzinfo=dt.UTC)  # fixed: every issuance of a job's CA agrees
CA_VALID_TO = dt.datetime(2045, 1, 1, tzinfo=dt.UTC)
LEAF_DAYS = 30  # longer than any job's max_hours allows
_CURVE = ec.SECP256R1()
_ORDER = 0xFFFFFFFF00000000FFFFFFFFFFFFFFFFBCE6FAADA7179E84F3B9CAC2FC632551  # of P-256


def _job_ca_key(server_secret: str, job_id: str) -> ec.EllipticCurvePrivateKey:
    # the job's sync secret, or the server secret: either way known to the control plane only
    seed = hmac.new(server_secret.encode(), f"sync-ca:{job_id}".encode(), hashlib.sha512).digest()
    return ec.derive_private_key(int.from_bytes(seed, "big") % (_ORDER - 1) + 1, _CURVE)


def _ca_name(job_id: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"cpn sync CA for job {job_id}")])


def job_ca_pem(server_secret: str, job_id: str) -> str:
    """The job's CA certificate (PEM): what every leader of the job trusts, and nothing else."""
    key = _job_ca_key(server_secret, job_id)
    serial = int.from_bytes(hashlib.sha256(f"sync-ca:{job_id}".encode()).digest()[:16], "big") >> 1
    cert = (
        x509.CertificateBuilder()
        .subject_name(_ca_name(job_id))
        .issuer_name(_ca_name(job_id))
        .public_key(key.public_key())
        .serial_number(serial or 1)
        .not_valid_before(CA_VALID_FROM)
        .not_valid_after(CA_VALID_TO)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )  # fmt: skip
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def leader_credentials(
    server_secret: str,
    job_id: str,
    participant: str,
    *,
    ca_pem: str | None = None,
    now: dt.datetime | None = None,
    names: tuple[str, ...] = (SERVER_NAME,),
) -> dict[str, str]:
    """A leader's TLS material as the worker config's ``sync`` section takes it: the job's CA
    (``ca_pem`` when the caller made it once for all the job's leaders), and a fresh key with a
    certificate of that CA for both ends of a connection, naming ``names`` (SAN DNS). Any issuance
    of the job's CA verifies any other's certificates: same name, same key."""
    now = now or dt.datetime.now(dt.UTC)
    ca_key = _job_ca_key(server_secret, job_id)
    key = ec.generate_private_key(_CURVE)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, participant[:64] or "leader")]))
        .issuer_name(_ca_name(job_id))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))  # hosts' clocks differ a little
        .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return {
        "tls_ca_pem": ca_pem or job_ca_pem(server_secret, job_id),
        "tls_cert_pem": cert.public_bytes(serialization.Encoding.PEM).decode(),
        "tls_key_pem": key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ).decode(),
    }


def checkpoint_credentials(
    server_secret: str, job_id: str, holder: str, *, ca_pem: str | None = None
) -> dict[str, str]:
    """One node's credentials for the job's checkpoint copies (``contracts.checkpoint_transfer``'s
    ``CheckpointTls`` as a dict): the job's CA and a certificate of it naming the job's checkpoint
    server, with which the node both serves its copies and fetches them."""
    tls = leader_credentials(
        server_secret, job_id, holder, ca_pem=ca_pem, names=(checkpoint_server_name(job_id),)
    )
    return {"ca_pem": tls["tls_ca_pem"], "cert_pem": tls["tls_cert_pem"], "key_pem": tls["tls_key_pem"]}


def group_credentials(
    server_secret: str, job_id: str, holder: str, *, ca_pem: str | None = None
) -> dict[str, str]:
    """One node's credentials for the rendezvous of the job's torchrun group spanning nodes
    (``training.rendezvous``, the worker config's ``group`` section): the job's CA and a
    certificate of it naming ``GROUP_TLS_SERVER_NAME``, for both ends of the relay."""
    return leader_credentials(server_secret, job_id, holder, ca_pem=ca_pem, names=(GROUP_TLS_SERVER_NAME,))
