"""The cluster's PKI, made in Python: one CA, the apiserver's serving certificate, client
certificates (admin, the controllers, the apiserver's kubelet client, one per node), the node
agents' serving certificates, the service-account signing key, and kubeconfigs that use them.

Everything is written 0600 under one directory the control plane owns and removes.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=2)


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_bytes(data)
    path.chmod(0o600)
    return path


def _key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


class PKI:
    """A CA under ``root`` and the certificates signed by it."""

    def __init__(self, root: Path) -> None:
        self.root = root
        now = datetime.datetime.now(datetime.timezone.utc)
        self._not_before = now - datetime.timedelta(minutes=5)
        self._ca_key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "airflow-mpi-test-ca")])
        self._ca_cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(now + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self._ca_key.public_key()), critical=False)
            .sign(self._ca_key, hashes.SHA256())
        )
        self.ca = KeyPair(
            _write(root / "ca.crt", self._ca_cert.public_bytes(serialization.Encoding.PEM)),
            _write(root / "ca.key", _key_pem(self._ca_key)),
        )

    @property
    def ca_pem(self) -> bytes:
        return self._ca_cert.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        name: str,
        common_name: str,
        organizations: tuple[str, ...] = (),
        *,
        server_names: tuple[str, ...] = (),
        server_ips: tuple[str, ...] = (),
        client: bool = True,
    ) -> KeyPair:
        """A key and certificate for ``common_name`` (groups: ``organizations``); a serving
        certificate when it has names or addresses."""
        key = ec.generate_private_key(ec.SECP256R1())
        attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations]
        attributes.append(x509.NameAttribute(NameOID.COMMON_NAME, common_name))
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        if server_names or server_ips:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name(attributes))
            .issuer_name(self._ca_cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(self._not_before)
            .not_valid_after(self._not_before + VALIDITY)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            # What kubeadm's certificates carry, and Python 3.13's strict verification requires.
            .add_extension(x509.KeyUsage(True, False, False, False, False, False, False, False, False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._ca_key.public_key()), critical=False
            )
        )
        if server_names or server_ips:
            alt = [x509.DNSName(n) for n in server_names] + [
                x509.IPAddress(ipaddress.ip_address(i)) for i in server_ips
            ]
            builder = builder.add_extension(x509.SubjectAlternativeName(alt), critical=False)
        cert = builder.sign(self._ca_key, hashes.SHA256())
        return KeyPair(
            _write(self.root / f"{name}.crt", cert.public_bytes(serialization.Encoding.PEM)),
            _write(self.root / f"{name}.key", _key_pem(key)),
        )

    def service_account_keys(self) -> KeyPair:
        """The token signing key (``key``) and its public half (``cert`` holds the public key)."""
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return KeyPair(_write(self.root / "sa.pub", public), _write(self.root / "sa.key", _key_pem(key)))

    def kubeconfig(self, path: Path, server: str, user: str, *, pair: KeyPair | None = None, token: str = "") -> Path:
        """A kubeconfig for ``server`` authenticating with a client certificate or a token."""
        credentials: dict[str, str] = (
            {"token": token}
            if token
            else {
                "client-certificate": str(pair.cert) if pair else "",
                "client-key": str(pair.key) if pair else "",
            }
        )
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "airflow-mpi-test", "cluster": {"server": server, "certificate-authority": str(self.ca.cert)}}
            ],
            "users": [{"name": user, "user": credentials}],
            "contexts": [{"name": user, "context": {"cluster": "airflow-mpi-test", "user": user}}],
            "current-context": user,
        }
        return _write(path, yaml.safe_dump(config).encode())
