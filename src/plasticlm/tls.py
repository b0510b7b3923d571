"""Throw-away TLS material for services on this machine or a private network: a CA and a
server certificate (used by the FedNL deployment and FedRefine's peer services)."""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def make_certificates(out: str | Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
                      ) -> dict[str, Path]:
    """A throw-away CA and a server certificate for ``hosts``: ca.crt, server.pem, server.key."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "plasticlm CA")])

    def cert(subject, public_key, extensions):
        b = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name)
             .public_key(public_key).serial_number(x509.random_serial_number())
             .not_valid_before(now - dt.timedelta(minutes=5))
             .not_valid_after(now + dt.timedelta(days=30)))
        for ext, critical in extensions:
            b = b.add_extension(ext, critical=critical)
        return b.sign(ca_key, hashes.SHA256())

    ca = cert(ca_name, ca_key.public_key(), [(x509.BasicConstraints(ca=True, path_length=None), True)])
    names = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    server = cert(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[-1])]),
                  key.public_key(),
                  [(x509.SubjectAlternativeName(names), False),
                   (x509.BasicConstraints(ca=False, path_length=None), True),
                   (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)])
    paths = {"ca": out / "ca.crt", "cert": out / "server.pem", "key": out / "server.key"}
    paths["ca"].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths["cert"].write_bytes(server.public_bytes(serialization.Encoding.PEM))
    # The key file is created 0600: never readable by others, not even for a moment.
    paths["key"].unlink(missing_ok=True)
    fd = os.open(paths["key"], os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return paths
