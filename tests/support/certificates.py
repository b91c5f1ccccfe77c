"""Test certificates: EC keys, a CA, server and client certificates signed by it, as PEM files."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

Issuer = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def certificate(
    name: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: Issuer | None = None,
    *,
    server: bool = False,
    dns_names: Sequence[str] | None = None,
) -> x509.Certificate:
    """A self-signed CA (no `issuer`), or a server or client certificate that `issuer` signs,
    valid for a day. Names: `dns_names` if given; a server is localhost and 127.0.0.1; a
    client is `NAME.kvcap.test` (for client_allowed_sans)."""
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject if issuer is None else issuer[0].subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=issuer is None, path_length=None), critical=True)
    )
    if issuer is None:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
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
        ).add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
    else:
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        builder = builder.add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer[1].public_key()), False
        )
    names: list[x509.GeneralName] = []
    if dns_names is not None:
        names = [x509.DNSName(dns) for dns in dns_names]
    elif server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    elif issuer is not None:
        names = [x509.DNSName(f"{name}.kvcap.test")]
    if names:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    signer = key if issuer is None else issuer[1]
    return builder.sign(signer, hashes.SHA256())


def write_certificate(path: Path, cert: x509.Certificate) -> Path:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return path


def write_key(path: Path, key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> Path:
    """The key as PKCS#8 PEM, encrypted with `password` when given."""
    encryption: serialization.KeySerializationEncryption = (
        serialization.NoEncryption()
        if password is None
        else serialization.BestAvailableEncryption(password)
    )
    path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    )
    return path
