"""TLS on gpud's connections: the controller's server context, the verifying context of its clients, and
plain words for a handshake that failed.

Only the standard library's ssl module, imported when a context is made: gpuctl imports this module on
every https call and must stay fast.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ssl


class TlsFileError(ValueError):
    """A certificate, key or CA file that cannot be used; the message names the file and the problem."""


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine alone (127.0.0.0/8, ::1, localhost): traffic to it never leaves."""
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    import ipaddress
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)  # ::ffff:127.0.0.1 is 127.0.0.1
    return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _readable(path: str, what: str) -> None:
    try:
        with open(path, "rb") as f:
            f.read(1)
    except OSError as exc:
        raise TlsFileError(f"cannot read the {what} {path}: {exc.strerror or exc}") from None


def server_context(cert: str, key: str) -> "ssl.SSLContext":
    """A server context presenting ``cert`` (PEM: the certificate, then any intermediates) with ``key``.

    TLS 1.2 at least. A missing or unreadable file, a file that is not PEM,
    or a key that does not belong to the certificate is a TlsFileError
    naming the file.
    """
    import ssl
    _readable(cert, "certificate")
    _readable(key, "private key")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsFileError(f"the private key {key} does not belong to the certificate {cert}") from None
        raise TlsFileError(f"the certificate {cert} or the private key {key} is not a PEM file "
                           f"of that kind ({exc.reason or exc})") from None
    return context


def client_context(ca: str | None) -> "ssl.SSLContext":
    """A client context that checks the server's certificate and host name against the CA certificates in
    the PEM file ``ca``, or the system's when None; a TlsFileError naming ``ca`` when it cannot be used."""
    import ssl
    if ca is None:
        return ssl.create_default_context()
    _readable(ca, "CA file")
    try:
        return ssl.create_default_context(cafile=ca)
    except ssl.SSLError as exc:
        raise TlsFileError(f"the CA file {ca} holds no PEM certificate ({exc.reason or exc})") from None


def handshake_failure(exc: BaseException, url: str, ca: str | None) -> str:
    """What went wrong in the TLS handshake with ``url``, in a sentence naming the problem.

    ``exc`` is the ssl error (a certificate that does not verify, a
    server that does not speak TLS, ...); ``ca`` the CA file the
    certificate was checked against (None: the system's).
    """
    import ssl
    against = f"the CA file {ca}" if ca else "the system's CA certificates"
    if isinstance(exc, ssl.SSLCertVerificationError):
        problem = exc.verify_message or exc.reason or str(exc)
        return f"the controller at {url} presented a certificate that does not verify against {against}: {problem}"
    reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
    if reason in ("WRONG_VERSION_NUMBER", "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG"):
        return f"the controller at {url} does not speak TLS (is it serving plain HTTP? then use http://)"
    return f"the TLS handshake with the controller at {url} failed: {reason}"


def speaks_tls(host: str, port: int, timeout: float) -> bool:
    """Whether the server at host:port completes a TLS handshake (its certificate unchecked): asked when a
    plain HTTP request there got no answer, to tell a TLS-only server from one that failed."""
    import socket
    import ssl
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            with probe.wrap_socket(sock):
                return True
    except (OSError, ValueError):
        return False
