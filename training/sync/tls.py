"""TLS credentials of the cross-region sync service: mutual TLS between a job's leaders.

Each leader holds a key, a certificate and the CA that signed every leader's certificate of the
job; servers require a client certificate from that CA and clients verify the server against it,
so only the job's own leaders can open a sync connection at all (the per-job HMAC still names the
calling region). Certificates name the service, not a host (``SERVER_NAME``): leaders move between
nodes and are reached by address.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from contracts.sync_config import SYNC_TLS_SERVER_NAME

SERVER_NAME = SYNC_TLS_SERVER_NAME  # the name every leader's certificate carries (SAN DNS)


@dataclass(frozen=True)
class SyncTls:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.ssl_server_credentials(
            [(self.key_pem, self.cert_pem)], root_certificates=self.ca_pem, require_client_auth=True
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca_pem, private_key=self.key_pem, certificate_chain=self.cert_pem
        )

    @staticmethod
    def channel_options() -> list[tuple[str, str]]:
        return [("grpc.ssl_target_name_override", SERVER_NAME)]
