"""A cluster's own certificate authority and the certificates it signs, for `gpud cert`.

The CA is ``ca.pem`` (its certificate, which nodes and gpuctl trust) and
``ca.key`` in one directory; a certificate issued for NAME is ``NAME.pem``
(the certificate, then the CA's, as a server sends its chain) and
``NAME.key``. Keys are ECDSA P-256 and written with mode 0600; no file is
ever overwritten.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import re
from dataclasses import dataclass

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
CA_DAYS = 3650
CERT_DAYS = 825  # the longest validity macOS and browsers accept for a server certificate
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class CertError(ValueError):
    """A certificate that cannot be made; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Issued:
    """Where a certificate and its key were written, and the names and addresses it is valid for."""

    cert: str
    key: str
    hosts: tuple[str, ...]
    not_after: datetime.datetime


def _write_new(path: str, data: bytes, mode: int) -> None:
    """Write ``data`` to a file that must not exist yet, created with ``mode`` (never wider, whatever the umask)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    except FileExistsError:
        raise CertError(f"{path} exists already; remove it first or choose another directory") from None
    except OSError as exc:
        raise CertError(f"cannot write {path}: {exc.strerror or exc}") from None
    with os.fdopen(fd, "wb") as f:
        os.fchmod(f.fileno(), mode)
        f.write(data)


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _cert_pem(cert) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return cert.public_bytes(serialization.Encoding.PEM)


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)


def make_ca(directory: str, name: str = "gpud cluster CA", days: int = CA_DAYS) -> Issued:
    """A new CA in ``directory`` (made if missing): ``ca.pem`` (0644) and ``ca.key`` (0600).

    A CertError when either file exists: an existing CA is never replaced,
    since every certificate it signed would stop being trusted.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    os.makedirs(directory, exist_ok=True)
    for file in (CA_CERT, CA_KEY):
        if os.path.exists(os.path.join(directory, file)):
            raise CertError(f"{os.path.join(directory, file)} exists already: {directory} holds a CA")
    key = _new_key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = _now()
    public = key.public_key()
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .sign(key, hashes.SHA256()))
    key_path, cert_path = os.path.join(directory, CA_KEY), os.path.join(directory, CA_CERT)
    _write_new(key_path, _key_pem(key), 0o600)
    _write_new(cert_path, _cert_pem(cert), 0o644)
    return Issued(cert_path, key_path, (), cert.not_valid_after_utc)


def _load_ca(directory: str):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_path, key_path = os.path.join(directory, CA_CERT), os.path.join(directory, CA_KEY)
    try:
        with open(cert_path, "rb") as f:
            cert = x509.load_pem_x509_certificate(f.read())
        with open(key_path, "rb") as f:
            key = serialization.load_pem_private_key(f.read(), password=None)
    except OSError as exc:
        raise CertError(f"no CA in {directory}: cannot read {exc.filename}: {exc.strerror or exc} "
                        f"(make one with: gpud cert ca {directory})") from None
    except ValueError as exc:
        raise CertError(f"the CA in {directory} cannot be read: {exc}") from None
    return cert, key


def host_names(hosts: list[str]):
    """The subject alternative names for ``hosts``: IP addresses as addresses, the rest as DNS names.

    A CertError names a host that is neither an address nor a DNS name.
    """
    from cryptography import x509
    names: list = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
            continue
        except ValueError:
            pass
        label = r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)"
        if not re.fullmatch(rf"(\*\.)?{label}(\.{label})*", host) or len(host) > 253:
            raise CertError(f"--host {host!r} is neither an IP address nor a DNS name")
        names.append(x509.DNSName(host.lower()))
    return names


def issue(ca_dir: str, name: str, hosts: list[str], out_dir: str | None = None, days: int = CERT_DAYS) -> Issued:
    """A certificate for ``name``, signed by the CA in ``ca_dir``, valid for ``hosts`` (names and addresses that
    clients connect to), for servers and clients; ``NAME.pem`` (0644, with the CA's certificate after it) and
    ``NAME.key`` (0600) in ``out_dir`` (default ``ca_dir``). A CertError says what is wrong."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not _NAME.fullmatch(name):
        raise CertError(f"--name {name!r}: use letters, digits, '.', '_' and '-' (it names the files)")
    if not hosts:
        raise CertError("name at least one --host: the address or DNS name clients connect to")
    sans = host_names(hosts)
    ca_cert, ca_key = _load_ca(ca_dir)
    out = out_dir or ca_dir
    os.makedirs(out, exist_ok=True)
    cert_path, key_path = os.path.join(out, f"{name}.pem"), os.path.join(out, f"{name}.key")
    for path in (cert_path, key_path):
        if os.path.exists(path):
            raise CertError(f"{path} exists already; remove it first or choose another --name")
    key = _new_key()
    now = _now()
    public = key.public_key()
    not_after = min(now + datetime.timedelta(days=days), ca_cert.not_valid_after_utc)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_cert.subject).public_key(public).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(not_after)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_new(key_path, _key_pem(key), 0o600)
    _write_new(cert_path, _cert_pem(cert) + _cert_pem(ca_cert), 0o644)
    return Issued(cert_path, key_path, tuple(hosts), cert.not_valid_after_utc)
