"""A throwaway PKI for the TLS tests: a CA, a server certificate for 127.0.0.1 /
localhost, a client certificate, and a rogue CA (same name, another key) that
signed none of them. EC P-256 keys, valid for a day; PEM files in a directory.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = ["Pki", "make_pki"]


@dataclass(frozen=True)
class Pki:
    ca: Path  # the CA that signed the server and client certificates
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    rogue_ca: Path  # a CA that did not


def make_pki(directory: Path) -> Pki:
    ca, ca_key = _make_ca("Tandem test CA")
    server, server_key = _make_leaf(ca, ca_key, "localhost", ExtendedKeyUsageOID.SERVER_AUTH)
    client, client_key = _make_leaf(ca, ca_key, "edge-7", ExtendedKeyUsageOID.CLIENT_AUTH)
    rogue, _ = _make_ca("Tandem test CA")  # same name, different key: must still be refused
    return Pki(
        ca=_write_cert(ca, directory / "ca.pem"),
        server_cert=_write_cert(server, directory / "server.pem"),
        server_key=_write_key(server_key, directory / "server.key"),
        client_cert=_write_cert(client, directory / "client.pem"),
        client_key=_write_key(client_key, directory / "client.key"),
        rogue_ca=_write_cert(rogue, directory / "rogue-ca.pem"),
    )


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> Path:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)
    return path


def _write_cert(cert: x509.Certificate, path: Path) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def _key_usage(*, key_cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not key_cert_sign,
        key_cert_sign=key_cert_sign,
        crl_sign=key_cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def _make_ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(key_cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _make_leaf(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    name: str,
    usage: x509.ObjectIdentifier,
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(key_cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if usage == ExtendedKeyUsageOID.SERVER_AUTH:
        builder = builder.add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
    return builder.sign(ca_key, hashes.SHA256()), key
