"""A small HTTP client for the controller's REST API, on the standard library only.

``gpuctl`` must start fast, so this module imports nothing heavy: no aiohttp,
no gpud.core, not even http.client or socket: plain HTTP goes through ``_socket``, imported
when the first request is made. Nor urllib.parse (with ipaddress, about a quarter of
Python's own start-up): a URL, a path or a query of plain characters is taken apart
and quoted here, anything else by urllib.parse. Nor json, which imports re: JSON goes
through gpud.plainjson, the json module's own C accelerator.
"""

from __future__ import annotations

import io
import os

from gpud import plainjson

TYPE_CHECKING = False  # typing is not imported at run time: gpuctl starts faster
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

DEFAULT_URL = "http://127.0.0.1:6830"  # the controller's default --listen
DEFAULT_TIMEOUT_S = 30.0
DEFAULT_RETRY_S = 60.0   # how long an idempotent request is sent again while the controller is unreachable
DEFAULT_CONNECT_RETRY_S = 10.0  # gpuctl: how long a safe request waits for a controller that refuses connections
STREAM_CHUNK = 64 * 1024

EXIT_OK = 0
EXIT_REFUSED = 1      # the controller answered 4xx
EXIT_USAGE = 2        # the command line or an input file is wrong
EXIT_UNREACHABLE = 3  # no answer, or the controller failed (5xx, not JSON)


class ClientError(Exception):
    """A request that did not succeed; ``exit_code`` is what gpuctl should exit with."""

    exit_code = EXIT_UNREACHABLE


class Unreachable(ClientError):
    """The controller could not be reached or did not answer."""

    def __init__(self, url: str, why: str, tried_s: float = 0.0):
        tried = f", still after {tried_s:.0f} s of retries (GPUD_RETRY sets how long)" if tried_s else ""
        super().__init__(f"cannot reach the controller at {url} ({why}{tried}); is it running? set GPUD_URL")
        self.url = url
        self.why = why
        self.refused = why == "connection refused"  # nothing was sent


class Standby(ClientError):
    """A standby controller answered (503): it did nothing; ``leader`` is the leader's URL when it names one."""

    def __init__(self, url: str, leader: str | None):
        where = f"the leader is at {leader}" if leader else "no controller leads right now"
        super().__init__(f"the controller at {url} is a standby and {where}; is the leader's URL in GPUD_URL?")
        self.leader = leader


class ApiError(ClientError):
    """The controller answered with an error status and its ``{"error": ...}`` message."""

    def __init__(self, status: int, message: str, field: str | None = None, index: int | None = None,
                 job: str | None = None):
        where = "".join([f", field {field!r}" if field else "", f", job #{index}" if index is not None else ""])
        hint = ""
        if status == 401:
            hint = "; set GPUD_TOKEN or 'token' in the client config"
        text = f"{message} (HTTP {status}{where}){hint}" if status < 500 else \
            f"the controller failed: {message} (HTTP {status})"
        super().__init__(text)
        self.status, self.message, self.field, self.index = status, message, field, index
        self.job = job  # the job the message names, when it names one
        self.exit_code = EXIT_REFUSED if 400 <= status < 500 else EXIT_UNREACHABLE


class ConfigFileError(ClientError):
    """The client config file exists but cannot be used."""

    exit_code = EXIT_USAGE


class TlsRefused(ClientError):
    """The TLS handshake with the controller failed: its certificate does not verify, or it speaks no TLS.

    Never retried: waiting does not make a certificate trusted.
    """


class Settings(tuple):
    """Where the controller is (``url``) and the credential to show it (``token``, or None): a pair, as a named
    tuple would be, without the collections module's import."""

    __slots__ = ()

    def __new__(cls, url: str, token: str | None) -> "Settings":
        return tuple.__new__(cls, (url, token))

    @property
    def url(self) -> str:
        return self[0]

    @property
    def token(self) -> str | None:
        return self[1]


def config_path(env: Mapping[str, str] = os.environ) -> str:
    """The client config file: ``$XDG_CONFIG_HOME/gpud/client.toml``, default ``~/.config/gpud/client.toml``."""
    base = env.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "gpud", "client.toml")


def load_settings(env: Mapping[str, str] = os.environ) -> Settings:
    """The controller URL and token: ``GPUD_URL``/``GPUD_TOKEN`` win over the config file, which wins over defaults.

    The config file holds ``url`` and ``token`` or ``token_file``; a config
    file that is not valid TOML, or a token file that cannot be read, is a
    ConfigFileError naming the file.
    """
    path = config_path(env)
    config: dict[str, Any] = {}
    if os.path.exists(path):
        config = _read_config(path)
    url = env.get("GPUD_URL") or config.get("url") or DEFAULT_URL
    token = env.get("GPUD_TOKEN") or config.get("token")
    if not token and config.get("token_file"):
        token_file = os.path.expanduser(str(config["token_file"]))
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ConfigFileError(f"{path}: token_file {token_file}: {exc.strerror or exc}") from None
    return Settings(str(url).rstrip("/"), token or None)


def configured_ca(env: Mapping[str, str] = os.environ) -> str | None:
    """The CA file an https controller's certificate is checked against: ``GPUD_CA``, else ``ca`` in the client
    config file (relative to the file's directory); None (the system's CA certificates) when neither names one.
    A ``ca`` that is not a path in quotes is a ConfigFileError naming the file."""
    if env.get("GPUD_CA"):
        return os.path.expanduser(env["GPUD_CA"])
    path, ca = _config_text(env, "ca", 'the path of a CA certificate in quotes, such as ca = "/etc/gpud/ca.pem"')
    if ca is None:
        return None
    return os.path.join(os.path.dirname(path), os.path.expanduser(ca))  # relative: to the file's directory


def configured_project(env: Mapping[str, str] = os.environ) -> str | None:
    """The default project for submits: ``project`` in the client config file, None when it names none.

    A config file that is not valid TOML, or whose ``project`` is not a
    non-empty string, is a ConfigFileError naming the file.
    """
    return _config_text(env, "project", 'a project\'s name in quotes, such as project = "vision"')[1]


def _config_text(env: Mapping[str, str], key: str, shape: str) -> tuple[str, str | None]:
    """The client config file's path and its ``key``, stripped (None when the file or the key is absent);
    a ConfigFileError saying the key must be ``shape`` when it is not a non-empty string."""
    path = config_path(env)
    if not os.path.exists(path):
        return path, None
    value = _read_config(path).get(key)
    if value is None:
        return path, None
    if not isinstance(value, str) or not value.strip():
        raise ConfigFileError(f"{path}: {key} must be {shape}")
    return path, value.strip()


def _read_config(path: str) -> dict[str, Any]:
    """The client config file's table; a plain file of string keys is read without importing tomllib."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigFileError(f"{path}: {exc}") from None
    from gpud.simpletoml import read_simple
    try:
        simple = read_simple(data.decode("utf-8"))
    except UnicodeDecodeError:
        simple = None
    if simple is not None:
        return dict(simple)
    import tomllib
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigFileError(f"{path}: {exc}") from None


class Client:
    """Calls the controller's ``/api/v1`` endpoints and returns their JSON, or raises ClientError."""

    def __init__(self, url: str, token: str | None = None, timeout: float = DEFAULT_TIMEOUT_S,
                 retry_s: float = DEFAULT_RETRY_S, connect_retry_s: float = 0.0, ca: str | None = None,
                 remember: str | None = None):
        # Several URLs, separated by commas: the controllers of one cluster, of which one leads. The client
        # stays with the one that answered and goes to the leader a standby names; with ``remember`` (a
        # file), the next client given the same URLs starts with the leader this one found.
        self._urls = [_controller_url(one.strip()) for one in url.split(",") if one.strip()] or \
            [_controller_url(url)]
        self._at = 0
        self._remember = remember if len(self._urls) > 1 else None
        self._remembered = self._recall()
        self.token = token
        self.timeout = timeout
        self.retry_s = retry_s
        self.connect_retry_s = connect_retry_s
        self.ca = ca
        self._tls: Any = None  # the ssl context of an https URL, made on the first request

    def _key(self) -> str:
        return ",".join(u for u, _ in self._urls)

    def _recall(self) -> str | None:
        """Start with the leader a client given the same URLs found last (kept in the ``remember`` file)."""
        if self._remember is None:
            return None
        try:
            with open(self._remember, encoding="utf-8") as f:
                leader = plainjson.loads(f.read()).get(self._key())
        except (OSError, ValueError, AttributeError):
            return None
        known = [u for u, _ in self._urls]
        if leader in known:
            self._at = known.index(leader)
        return leader

    def _found(self) -> None:
        """The controller at ``url`` answered: remember it for the next client, when it is a new one."""
        if self._remember is None or self._remembered == self.url:
            return
        self._remembered = self.url
        try:
            try:
                with open(self._remember, encoding="utf-8") as f:
                    known = plainjson.loads(f.read())
                known = known if isinstance(known, dict) else {}
            except (OSError, ValueError):
                known = {}
            known[self._key()] = self.url
            os.makedirs(os.path.dirname(self._remember), mode=0o700, exist_ok=True)
            tmp = f"{self._remember}.{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(plainjson.dumps(known).encode())
            os.replace(tmp, self._remember)
        except OSError:
            pass  # only a shortcut: the next client finds the leader again

    @property
    def url(self) -> str:
        """The controller URL the client uses now (the leader, once one answered)."""
        return self._urls[self._at][0]

    @property
    def _parts(self) -> Any:
        return self._urls[self._at][1]

    def _move(self, leader: str | None = None) -> bool:
        """Go to ``leader`` (added when it is not among the URLs), else to the next URL; True when that is new.

        False when the next URL is the first again: every URL was tried once.
        """
        if leader:
            try:
                wanted = _controller_url(leader)
            except ConfigFileError:
                wanted = None
            if wanted is not None and wanted[0] != self.url:
                known = [u for u, _ in self._urls]
                if wanted[0] not in known:
                    self._urls.append(wanted)
                    known.append(wanted[0])
                self._at = known.index(wanted[0])
                return True
        self._at = (self._at + 1) % len(self._urls)
        return self._at != 0

    @classmethod
    def from_environment(cls, env: Mapping[str, str] = os.environ) -> "Client":
        """A client for the controller named by ``GPUD_URL``/``GPUD_TOKEN`` or the config file, checking an https
        controller's certificate against ``GPUD_CA`` or the file's ``ca`` (default: the system's CAs).

        ``GPUD_TIMEOUT`` (seconds) bounds the wait for each answer;
        ``GPUD_RETRY`` (seconds, default DEFAULT_CONNECT_RETRY_S, 0: never)
        how long a request safe to repeat waits for a controller that
        refuses connections (one restarting, say).
        """
        settings = load_settings(env)
        try:
            timeout = float(env.get("GPUD_TIMEOUT") or DEFAULT_TIMEOUT_S)
        except ValueError:
            timeout = -1.0
        if not timeout > 0 or timeout == float("inf"):
            raise ConfigFileError(f"GPUD_TIMEOUT must be a number of seconds, not {env.get('GPUD_TIMEOUT')!r}")
        text = env.get("GPUD_RETRY")
        try:
            connect_retry_s = float(text) if text else DEFAULT_CONNECT_RETRY_S
        except ValueError:
            connect_retry_s = -1.0
        if not 0 <= connect_retry_s < float("inf"):
            raise ConfigFileError(f"GPUD_RETRY must be a number of seconds (0: no retries), not {text!r}")
        cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return cls(settings.url, settings.token, timeout, connect_retry_s=connect_retry_s, ca=configured_ca(env),
                   remember=os.path.join(cache, "gpud", "leader.json"))

    def tls_context(self) -> Any:
        """The ssl context that checks the controller's certificate (against ``ca``, or the system's CAs),
        for https and wss; None for a plain http URL. A CA file that cannot be used is a ConfigFileError."""
        if self._parts.scheme != "https":
            return None
        if self._tls is None:
            from gpud.tls import TlsFileError, client_context
            try:
                self._tls = client_context(self.ca)
            except TlsFileError as exc:
                raise ConfigFileError(f"{exc} (set by GPUD_CA or 'ca' in the client config)") from None
        return self._tls

    def get(self, path: str, query: Mapping[str, Any] | None = None) -> Any:
        """GET ``/api/v1/<path>`` and return the parsed JSON answer (a read: retried as ``request`` says)."""
        return self.request("GET", path, query=query, retry=True)

    def get_all(self, path: str, query: Mapping[str, Any] | None = None, key: str = "jobs",
                page: int = 5000) -> Any:
        """GET every page of a paged listing, following ``next_cursor``, as one answer.

        The items of all pages are under ``key`` in order; ``arrays``
        (summaries by array id) are merged; ``next_cursor`` is None.
        """
        query = {**(query or {}), "limit": page}
        answer = self.get(path, query)
        while answer.get("next_cursor"):
            more = self.get(path, {**query, "cursor": answer["next_cursor"]})
            answer[key].extend(more.get(key) or [])
            if isinstance(more.get("arrays"), dict):
                answer.setdefault("arrays", {}).update(more["arrays"])
            answer["next_cursor"] = more.get("next_cursor")
        return answer

    def post(self, path: str, body: Any = None, *, idempotent: bool = False) -> Any:
        """POST a JSON body to ``/api/v1/<path>`` and return the parsed JSON answer.

        ``idempotent``: the request carries a new Idempotency-Key and is sent
        again with it while the connection is lost (for up to ``retry_s``), so
        a controller that restarts mid-request does it once, never twice.
        """
        if not idempotent:
            return self.request("POST", path, body=body)
        key = os.urandom(16).hex()
        return self.request("POST", path, body=body, headers={"Idempotency-Key": key}, retry=True)

    def request(self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None,
                headers: Mapping[str, str] | None = None, retry: bool = False) -> Any:
        """Send one request and return the JSON answer; any failure is a ClientError with one clear line.

        With ``retry`` (for requests safe to repeat), a connection lost once the
        request may have been sent is retried, with a growing pause, until
        ``retry_s`` has passed; while every connection is refused (the
        controller is not running, or restarting) it is retried until
        ``connect_retry_s`` has passed, then the refusal is said.
        """
        import time
        began = time.monotonic()
        pause = 0.05
        never_reached = True
        several = len(self._urls) > 1
        round_tried = 0
        while True:
            failure: ClientError
            try:
                answer = self._exchange(method, path, query, body, headers)
                self._found()
                return answer
            except Standby as exc:  # it did nothing: any request may go to the leader it names, or the next URL
                round_tried += 1
                if round_tried <= len(self._urls) and self._move(exc.leader):
                    continue
                failure, refused, why = exc, True, "a standby, and no controller leads right now"
            except Unreachable as exc:
                # Refused: nothing was sent, so any request may go to the next controller; a lost answer only
                # when the request is safe to repeat.
                if several and (exc.refused or retry):
                    round_tried += 1
                    if round_tried < len(self._urls) and self._move():
                        continue
                failure, refused, why = exc, exc.refused, exc.why
            round_tried = 0
            never_reached = never_reached and refused
            limit = self.connect_retry_s if never_reached else self.retry_s
            if several and never_reached and self.connect_retry_s > 0:
                limit = max(limit, self.retry_s)  # a takeover takes the lease's timeout and more: wait it out
            waited = time.monotonic() - began
            # With several controllers, one refusing and the others standing by is a takeover under way.
            if not (retry or (several and never_reached)) or waited + pause > limit:
                if (retry or several) and waited >= 1.0:
                    raise Unreachable(self.url, why, waited) from None
                raise failure
            time.sleep(pause)
            pause = min(pause * 2, 1.0)

    def _exchange(self, method: str, path: str, query: Mapping[str, Any] | None, body: Any,
                  headers: Mapping[str, str] | None) -> Any:
        response = self._open(method, path, query, body, extra=headers)
        try:
            data = self._read(response)
        finally:
            response.close()
        try:
            return plainjson.loads(data) if data else None
        except ValueError:
            raise ApiError(502, "the answer is not JSON") from None

    def stream(self, path: str, query: Mapping[str, Any] | None = None) -> Iterator[bytes]:
        """GET ``/api/v1/<path>`` and yield the body's bytes as they arrive (for logs that follow a job)."""
        response = self._open("GET", path, query, None, streaming=True)
        try:
            chunks = response.chunks()
            while True:
                try:
                    chunk = next(chunks, None)
                except (OSError, ValueError) as exc:
                    raise Unreachable(self.url, _why(exc)) from None
                if chunk is None:
                    return
                if chunk:
                    yield chunk
        finally:
            response.close()

    def _target(self, path: str, query: Mapping[str, Any] | None) -> str:
        target = f"{self._parts.path.rstrip('/')}/api/v1/{path.lstrip('/')}"
        pairs = {k: v for k, v in (query or {}).items() if v is not None and v is not False}
        if pairs:
            target += "?" + _urlencode({k: (1 if v is True else v) for k, v in pairs.items()})
        return target

    def _open(self, method: str, path: str, query, body, streaming: bool = False,
              extra: Mapping[str, str] | None = None) -> "_Response":
        headers = {"Accept": "application/json", "User-Agent": "gpuctl", **(extra or {})}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        payload = b""
        if body is not None:
            payload = plainjson.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        tls = self.tls_context()
        try:
            response = _Response.send(self._parts, self.timeout, method, self._target(path, query), headers, payload,
                                      tls)
            if streaming:
                response.sock.settimeout(None)  # a followed log may stay quiet for hours
        except (OSError, ValueError) as exc:
            if tls is not None:
                import ssl
                if isinstance(exc, ssl.SSLError):
                    from gpud.tls import handshake_failure
                    hint = "; set GPUD_CA or 'ca' in the client config to the cluster's CA certificate" \
                        if isinstance(exc, ssl.SSLCertVerificationError) else ""
                    raise TlsRefused(handshake_failure(exc, self.url, self.ca) + hint) from None
            elif isinstance(exc, (ValueError, ConnectionResetError)):
                from gpud.tls import speaks_tls
                if speaks_tls(self._parts.hostname or "", self._parts.port or 80, self.timeout):
                    raise TlsRefused(f"the controller at {self.url} serves TLS only: use "
                                     f"https://{self._parts.netloc}{self._parts.path} in GPUD_URL or the client "
                                     f"config") from None
            raise Unreachable(self.url, _why(exc)) from None
        if response.status >= 400:
            try:
                data = self._read(response)
            finally:
                response.close()
            if response.status == 503:
                standby = _standby(data)
                if standby is not None:
                    raise Standby(self.url, standby or None)
            raise _api_error(response.status, data)
        return response

    def _read(self, response: "_Response") -> bytes:
        try:
            return b"".join(response.chunks())
        except (OSError, ValueError) as exc:
            raise Unreachable(self.url, _why(exc)) from None


class _Response:
    """One HTTP/1.1 exchange on its own connection (``Connection: close``), read incrementally.

    A plain socket rather than http.client: http.client pulls in the email
    package, about 20 ms of every gpuctl call.
    """

    def __init__(self, sock, reader, status: int, headers: dict[str, str]):
        self.sock, self._reader, self.status, self.headers = sock, reader, status, headers

    @classmethod
    def send(cls, parts, timeout: float, method: str, target: str, headers: dict[str, str],
             payload: bytes, tls: Any = None) -> "_Response":
        """Connect, send the request, and read the status line and headers; raises OSError or ValueError.

        An https URL is spoken over TLS with the ssl context ``tls`` (default: the system's CAs)."""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        # An ASCII name is passed as bytes: as str, it would be encoded by the idna codec (~2 ms to import).
        host_name = parts.hostname.encode("ascii") if parts.hostname.isascii() else parts.hostname
        if parts.scheme == "https":
            import socket
            sock = socket.create_connection((host_name, port), timeout=timeout)
        else:
            sock = _connect(host_name, port, timeout)
        try:
            if parts.scheme == "https":
                if tls is None:
                    import ssl
                    tls = ssl.create_default_context()
                sock = tls.wrap_socket(sock, server_hostname=parts.hostname)
            host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
            lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close",
                     f"Content-Length: {len(payload)}", *(f"{k}: {v}" for k, v in headers.items())]
            sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)
            reader = sock.makefile("rb") if parts.scheme == "https" else io.BufferedReader(_SocketReader(sock))
            status_line = reader.readline(65537).decode("latin-1")
            version, _, rest = status_line.partition(" ")
            if not version.startswith("HTTP/") or not rest[:3].isdigit():
                raise ValueError("the answer is not HTTP" if status_line else "the connection closed with no answer")
            answer_headers = {}
            while True:
                line = reader.readline(65537).decode("latin-1").rstrip("\r\n")
                if not line:
                    break
                key, _, value = line.partition(":")
                answer_headers[key.strip().lower()] = value.strip()
            return cls(sock, reader, int(rest[:3]), answer_headers)
        except BaseException:
            sock.close()
            raise

    def chunks(self) -> Iterator[bytes]:
        """The body's bytes as they arrive, de-chunked; raises ValueError on a malformed body."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                size_line = self._reader.readline(1026)
                if not size_line:
                    raise ValueError("the answer was cut short")
                size = int(size_line.split(b";")[0].strip() or b"x", 16)
                if size == 0:
                    return
                data = self._reader.read(size + 2)
                if len(data) < size + 2:
                    raise ValueError("the answer was cut short")
                yield data[:size]
        length = self.headers.get("content-length")
        remaining = int(length) if length is not None else None
        while remaining is None or remaining > 0:
            data = self._reader.read1(STREAM_CHUNK if remaining is None else min(remaining, STREAM_CHUNK))
            if not data:
                if remaining:
                    raise ValueError("the answer was cut short")
                return
            if remaining is not None:
                remaining -= len(data)
            yield data

    def close(self) -> None:
        """Close the connection."""
        self._reader.close()
        self.sock.close()


def _connect(host: bytes | str, port: int, timeout: float):
    """A connected plain TCP socket, as socket.create_connection makes one, from the C module alone.

    The socket module wraps _socket in enums and selectors that cost every
    gpuctl call ~3 ms; plain HTTP needs none of them.
    """
    import _socket
    error: OSError | None = None
    for family, kind, proto, _, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as exc:
            sock.close()
            error = exc
    raise error or OSError(f"no address for {host!r}")


class _SocketReader(io.RawIOBase):
    """A socket's incoming bytes as a raw stream, for io.BufferedReader (what socket.makefile does)."""

    def __init__(self, sock):
        super().__init__()
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        return self._sock.recv_into(buffer)


def job_path(job_id: str, *rest: str) -> str:
    """The API path of a job (``jobs/42/why``), with the id escaped."""
    return "/".join(["jobs", _quote(str(job_id)), *rest])


_UNRESERVED = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-~")
_HOST = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-")
_PATH = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789/._-~")


class _Url:
    """The parts of a URL the client uses, named as urllib.parse.urlsplit names them."""

    __slots__ = ("scheme", "netloc", "path", "hostname", "port")

    def __init__(self, scheme: str, netloc: str, path: str, hostname: str, port: int | None):
        self.scheme, self.netloc, self.path, self.hostname, self.port = scheme, netloc, path, hostname, port


def _split_url(url: str):
    """``urllib.parse.urlsplit(url)`` for the parts the client uses.

    A URL of the usual shape (http or https, a host name or IPv4 address, a
    port, a plain path) is taken apart here; any other goes to urlsplit.
    """
    scheme, sep, rest = url.partition("://")
    netloc, slash, path = rest.partition("/")
    host, colon, port = netloc.partition(":")
    if sep and scheme in ("http", "https") and host and _HOST.issuperset(host) and _PATH.issuperset(path) \
            and (not colon or (port.isascii() and port.isdigit() and int(port) <= 65535)):
        return _Url(scheme, netloc, slash + path, host.lower(), int(port) if colon else None)
    from urllib.parse import urlsplit
    return urlsplit(url)


def _quote(text: str, plus: bool = False) -> str:
    """``urllib.parse.quote(text, safe="")`` (``quote_plus`` with ``plus``): every byte but A-Z a-z 0-9 _ . - ~ as %XX."""
    return "".join(chr(b) if b in _UNRESERVED else "+" if plus and b == 32 else f"%{b:02X}"
                   for b in text.encode("utf-8"))


def _urlencode(query: Mapping[str, Any]) -> str:
    """``urllib.parse.urlencode(query)`` for a query of single values."""
    return "&".join(f"{_quote(str(key), True)}={_quote(str(value), True)}" for key, value in query.items())


def _controller_url(url: str) -> tuple[str, Any]:
    """One controller URL, normalised, and its parts; ConfigFileError when it is not http(s)://HOST:PORT."""
    parts = _split_url(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigFileError(f"bad controller URL {url!r}: use http://HOST:PORT (several: separated by commas)")
    return f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}", parts


def _standby(data: bytes) -> str | None:
    """The leader's URL ("" when none leads) when ``data`` is a standby's answer; None when it is not one."""
    try:
        doc = plainjson.loads(data)
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("role") != "standby":
        return None
    leader = doc.get("leader")
    return leader if isinstance(leader, str) else ""


def _api_error(status: int, data: bytes) -> ApiError:
    try:
        doc = plainjson.loads(data)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("error"), str):
        index, job = doc.get("index"), doc.get("job")
        return ApiError(status, doc["error"], doc.get("field"), index if isinstance(index, int) else None,
                        job if isinstance(job, str) else None)
    text = data.decode("utf-8", "replace").strip().splitlines()
    return ApiError(status, text[0][:200] if text else "no message")


def _why(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    import _socket
    if isinstance(exc, _socket.gaierror):
        return f"unknown host: {exc.strerror}"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
