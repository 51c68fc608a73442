"""TLS on real loopback servers with certificates made in the test: REST over HTTPS, the agent port
verified with a CA, and mTLS where a node gets its client certificate at enrollment."""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID
from pydantic import ValidationError

from agent.tls import certificate_request, load_or_create_key
from contracts.errors import FailedPrecondition, InvalidArgument
from orchestration.db.models import Node
from orchestration.settings import Settings
from proto.cpn.agent.v1 import agent_pb2, agent_pb2_grpc
from resource_layer.tls import AgentTls, issue_client_certificate, load_csr
from service_layer.server import ServerHandle, start_server_in_thread
from tests.certs import Ca
from tests.resource_layer.harness import enrollment_token, wait_for

REPO = Path(__file__).resolve().parents[2]


def _settings(tmp: Path, **tls: object) -> Settings:
    return Settings(
        environment="development", data_dir=tmp, http_port=0, grpc_port=0, grpc_enroll_port=0,
        heartbeat_interval_s=0.3, heartbeat_misses=3, **tls,
    )  # fmt: skip


@pytest.fixture
def ca() -> Ca:
    return Ca()


def _serve(tmp: Path, ca: Ca, *, node_ca: Ca | None = None) -> ServerHandle:
    cert, key = ca.issue("cpn control plane").write(tmp / "tls", "server")
    tls: dict[str, object] = {"tls_cert_file": cert, "tls_key_file": key}
    if node_ca is not None:
        tls["tls_client_ca_file"], tls["tls_client_ca_key_file"] = node_ca.pair.write(tmp / "tls", "node-ca")
    return start_server_in_thread(_settings(tmp, **tls))


@pytest.fixture
def agents(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
    for log in tmp_path.glob("agent*/agent.log"):
        sys.stderr.write(f"--- {log} ---\n{log.read_text(errors='replace')[-4000:]}\n")


def _start_agent(
    procs: list[subprocess.Popen[bytes]], handle: ServerHandle, work: Path, *flags: str
) -> subprocess.Popen[bytes]:
    work.mkdir(parents=True, exist_ok=True)
    args = [
        sys.executable, "-m", "agent", "--server", handle.grpc_target,
        "--token", enrollment_token(handle.ctx), "--region", "eu-west", "--cluster", "paris-1",
        "--provider", "lumen", "--devices", "cpu:1", "--price-per-device-hour", "1",
        "--work-dir", str(work), "--reconnect-max-s", "1",
        "--no-measure-profile",  # TLS is under test here; tests/agent/test_profile.py measures
        "--no-probe-staging",
        *flags,
    ]  # fmt: skip
    with open(work / "agent.log", "ab") as out:
        proc = subprocess.Popen(args, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    procs.append(proc)
    return proc


def _alive_node(handle: ServerHandle) -> Node | None:
    with handle.ctx.session_factory() as s:
        return s.query(Node).filter(Node.status == "alive", Node.last_heartbeat_at.is_not(None)).first()


def _register_request(token: str = "", csr: bytes = b"") -> agent_pb2.RegisterRequest:
    return agent_pb2.RegisterRequest(
        enrollment_token=token, region="eu-west", cluster="paris-1", provider="lumen", hostname="h",
        devices=[agent_pb2.Device(index=0, model="cpu", memory_gb=1, measured_tflops=0.1, kind="cpu")],
        price_per_device_hour=1.0, agent_version="0.1.0", advertise_host="127.0.0.1",
        sync_port_min=29600, sync_port_max=29609, csr_pem=csr.decode(),
    )  # fmt: skip


def _code(call: object) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()  # type: ignore[operator]
    return info.value.code()  # type: ignore[attr-defined]


def test_rest_and_the_agent_port_speak_tls_verified_with_the_ca(
    tmp_path: Path, ca: Ca, agents: list[subprocess.Popen[bytes]]
) -> None:
    ca_file, _ = ca.pair.write(tmp_path / "tls", "ca")
    with _serve(tmp_path, ca) as handle:
        assert handle.http_url.startswith("https://")
        verify = ssl.create_default_context(cafile=str(ca_file))
        assert httpx.get(f"{handle.http_url}/healthz", verify=verify).status_code == 200
        with pytest.raises(httpx.HTTPError):  # plaintext HTTP gets no answer from a TLS port
            httpx.get(handle.http_url.replace("https://", "http://") + "/healthz")
        with pytest.raises(httpx.ConnectError):  # a client trusting another CA refuses the server
            httpx.get(f"{handle.http_url}/healthz", verify=ssl.create_default_context(cafile=str(
                Ca("other").pair.write(tmp_path / "other", "ca")[0])))  # fmt: skip

        # A real agent verifies the control plane with the CA, registers and heartbeats over TLS.
        _start_agent(agents, handle, tmp_path / "agent-a", "--tls-ca-file", str(ca_file))
        wait_for(lambda: _alive_node(handle), timeout=60, what="the TLS agent to connect")

        token = enrollment_token(handle.ctx)
        with grpc.insecure_channel(handle.grpc_target) as plain:  # plaintext: no handshake, no token use
            stub = agent_pb2_grpc.AgentServiceStub(plain)
            assert (
                _code(lambda: stub.Register(_register_request(token), timeout=5))
                == grpc.StatusCode.UNAVAILABLE
            )
        other = grpc.ssl_channel_credentials(Ca("impostor").pair.cert_pem)
        with grpc.secure_channel(handle.grpc_target, other) as wrong:
            stub = agent_pb2_grpc.AgentServiceStub(wrong)
            assert (
                _code(lambda: stub.Register(_register_request(token), timeout=5))
                == grpc.StatusCode.UNAVAILABLE
            )
        with grpc.secure_channel(handle.grpc_target, grpc.ssl_channel_credentials(ca.pair.cert_pem)) as ok:
            stub = agent_pb2_grpc.AgentServiceStub(ok)
            # without a node CA this control plane cannot sign a CSR, and says so before using the token
            bad = _register_request(token, csr=b"-----BEGIN CERTIFICATE REQUEST-----")
            assert _code(lambda: stub.Register(bad, timeout=5)) == grpc.StatusCode.FAILED_PRECONDITION
            assert stub.Register(_register_request(token), timeout=5).node_id  # the token was unused


def test_mtls_node_certificate_issued_at_enrollment_names_the_node(
    tmp_path: Path, ca: Ca, agents: list[subprocess.Popen[bytes]]
) -> None:
    node_ca = Ca("cpn node CA")
    ca_file, _ = ca.pair.write(tmp_path / "tls", "ca")
    with _serve(tmp_path, ca, node_ca=node_ca) as handle:
        assert handle.enroll_port is not None
        enroll = f"127.0.0.1:{handle.enroll_port}"
        work = tmp_path / "agent-m"
        _start_agent(agents, handle, work, "--tls-ca-file", str(ca_file), "--enroll-server", enroll)
        node = wait_for(lambda: _alive_node(handle), timeout=60, what="the mTLS agent to connect")
        cert = x509.load_pem_x509_certificate((work / "node-cert.pem").read_bytes())
        assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == node.id
        assert cert.issuer == node_ca.cert.subject
        assert oct((work / "node-key.pem").stat().st_mode & 0o777) == "0o600"
        node_token = json.loads((work / "agent-state.json").read_text())["credentials"]["node_token"]
        hello = agent_pb2.AgentMessage(hello=agent_pb2.Hello(node_id=node.id, node_token=node_token))

        server_only = grpc.ssl_channel_credentials(ca.pair.cert_pem)
        with grpc.secure_channel(handle.grpc_target, server_only) as no_cert:  # the agent port needs one
            stub = agent_pb2_grpc.AgentServiceStub(no_cert)
            assert (
                _code(lambda: stub.Register(_register_request("x"), timeout=5)) == grpc.StatusCode.UNAVAILABLE
            )
        with grpc.secure_channel(enroll, server_only) as enrollment:  # Register only on the enrollment port
            stub = agent_pb2_grpc.AgentServiceStub(enrollment)
            assert (
                _code(lambda: list(stub.Connect(iter([hello]), timeout=5))) == grpc.StatusCode.UNAUTHENTICATED
            )
        # A valid certificate of the node CA, but for another name: it cannot speak for this node,
        # even with this node's token.
        stranger = node_ca.issue("another-node")
        creds = grpc.ssl_channel_credentials(ca.pair.cert_pem, stranger.key_pem, stranger.cert_pem)
        with grpc.secure_channel(handle.grpc_target, creds) as impostor:
            stub = agent_pb2_grpc.AgentServiceStub(impostor)
            assert (
                _code(lambda: list(stub.Connect(iter([hello]), timeout=5)))
                == grpc.StatusCode.PERMISSION_DENIED
            )
            again = _register_request()  # nor re-register as it
            again.node_id, again.node_token = node.id, node_token
            assert _code(lambda: stub.Register(again, timeout=5)) == grpc.StatusCode.PERMISSION_DENIED
        assert _alive_node(handle) is not None


def test_issued_certificates_name_the_node_whatever_the_csr_asks(tmp_path: Path) -> None:
    node_ca = Ca("cpn node CA")
    key = load_or_create_key(tmp_path / "k.pem")
    csr = load_csr(certificate_request(key, "admin"))
    cert = x509.load_pem_x509_certificate(
        issue_client_certificate(node_ca.pair.cert_pem, node_ca.pair.key_pem, csr, "node-123")
    )
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "node-123"
    for bad in (b"", b"garbage", b"x" * 20_000):
        with pytest.raises(InvalidArgument):
            load_csr(bad)


def test_tls_settings_are_complete_or_refused(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="set together"):
        Settings(tls_cert_file=tmp_path / "c.pem")
    with pytest.raises(ValidationError, match="needs CPN_TLS_CERT_FILE"):
        Settings(tls_client_ca_file=tmp_path / "ca.pem")
    cert, key = Ca().issue("cp").write(tmp_path, "server")
    (tmp_path / "bad.key").write_text("not a key")
    ca_file, _ = Ca().pair.write(tmp_path, "ca")
    bad = Settings(tls_cert_file=cert, tls_key_file=key, tls_client_ca_file=ca_file,
                   tls_client_ca_key_file=tmp_path / "bad.key")  # fmt: skip
    with pytest.raises(FailedPrecondition, match="not usable PEM"):
        AgentTls.from_settings(bad)
    with pytest.raises(FailedPrecondition, match="cannot read"):
        AgentTls.from_settings(Settings(tls_cert_file=tmp_path / "none.crt", tls_key_file=key))
