"""What a deployment needs to reach the pipeline service beyond loopback (the compose picture's airflow-init makes it
once, into a volume only the deployment mounts): the service's secret, a TLS key and a self-signed certificate
naming the host the service is reached by, and the Airflow connection that reaches it (https, the secret as its
password, the certificate as the one CA to trust). Kept across starts; delete the files to rotate them."""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import secrets
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spark_jobs.service_client import ServiceConnection

CERT_DAYS = 825  # the longest validity clients accept for a server certificate


@dataclass(frozen=True)
class ServiceCredentials:
    directory: Path
    # where the callers find the certificate, when not in `directory`: a deployment keeps the secret and the key
    # where only the service reads them and gives its callers the certificate alone
    ca_file: Path | None = None

    @property
    def token(self) -> Path:
        return self.directory / "service.token"

    @property
    def key(self) -> Path:
        return self.directory / "service.key"

    @property
    def cert(self) -> Path:
        return self.directory / "service.crt"

    @property
    def connection(self) -> Path:
        """The connection in Airflow's JSON form of one connection (AIRFLOW_CONN_<ID>, ServiceConnection.from_file)."""
        return self.directory / "service-connection.json"

    @property
    def airflow_import(self) -> Path:
        """The same, keyed by its id, as `airflow connections import` reads it."""
        return self.directory / "service-connections-import.json"

    def ensure(self, host: str, port: int, conn_id: str) -> bool:
        """Makes the secret, key and certificate unless all three exist (True when made), and writes the
        connection to the host and port with them."""
        made = not (self.token.exists() and self.key.exists() and self.cert.exists())
        if made:
            key_pem, cert_pem = self_signed(host)
            write_private(self.key, key_pem)
            write_whole(self.cert, cert_pem, PUBLIC)
            write_private(self.token, (secrets.token_urlsafe(32) + "\n").encode())
        if self.ca_file is not None:  # public: the callers' copy of the certificate, refreshed with it
            write_whole(self.ca_file, self.cert.read_bytes(), PUBLIC)
        connection = ServiceConnection.at("https", host, port, self.token.read_text().strip(),
                                          str(self.ca_file or self.cert))
        write_private(self.connection, (connection.airflow_json() + "\n").encode())
        keyed = {conn_id: json.loads(connection.airflow_json())}
        write_private(self.airflow_import, (json.dumps(keyed) + "\n").encode())
        return made


def self_signed(host: str) -> tuple[bytes, bytes]:
    """(key, certificate) in PEM: an EC P-256 key and a certificate for `host` signed by itself, usable both as the
    server's certificate and as the CA its clients trust."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, host)])
    now = dt.datetime.now(dt.UTC)
    public = key.public_key()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=CERT_DAYS))
            .add_extension(x509.SubjectAlternativeName([_subject(host)]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
            .sign(key, hashes.SHA256()))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return key_pem, cert.public_bytes(serialization.Encoding.PEM)


def _subject(host: str) -> Any:
    """The name a client checks the certificate against: an IP address is matched only as one (a DNS name of
    "10.0.0.5" is refused by every client)."""
    from cryptography import x509

    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


PRIVATE, PUBLIC = 0o600, 0o644  # a secret or key; a certificate


def write_private(path: Path, data: bytes) -> None:
    """Written whole and readable by this user only (`write_whole`)."""
    write_whole(path, data, PRIVATE)


def write_whole(path: Path, data: bytes, mode: int) -> None:
    """Written whole (a reader never sees half a file) with `mode`. The partial file is a new file of an unpredictable
    name (mkstemp: O_CREAT | O_EXCL, mode 600; os.open follows no link it makes), so a link planted in the folder is
    never written through; the rename then replaces whatever `path` was, a link included, never its target."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, partial = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            os.fchmod(handle.fileno(), mode)
        os.replace(partial, path)
    except BaseException:
        Path(partial).unlink(missing_ok=True)
        raise
