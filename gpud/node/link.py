"""The node's WebSocket to the controller: connect, register, heartbeat, pass orders on; reconnect with backoff."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from typing import Any, AsyncContextManager, AsyncIterator, Callable, Protocol, TypeGuard
from urllib.parse import urlsplit

import aiohttp

from gpud import jsontext
from gpud.channel import ws_texts
from gpud.waits import wait_event

log = logging.getLogger(__name__)
FIRST_BACKOFF_S = 0.2
DEFAULT_HEARTBEAT_S = 5.0
CONNECT_TIMEOUT_S = 10.0  # a connection attempt through a cut link fails after this, and is tried again
CLOSE_TIMEOUT_S = 2.0  # how long closing a connection waits for the controller's answer
KEPT_HEARTBEATS = 64  # heartbeats awaiting the controller's answer that are remembered

# Opens one connection to the controller: the channel to send on and the texts that come in.
Connector = Callable[[], AsyncContextManager[tuple[Any, AsyncIterator[str]]]]


class LinkOwner(Protocol):
    """What the link asks of the node it serves."""

    def register_message(self) -> dict:
        """The ``register`` message, with the node's whole task list (sent on every connect)."""

    def heartbeat_message(self) -> dict:
        """The ``heartbeat`` message: GPUs and the whole task list."""

    def registered(self, message: dict) -> None:
        """Called when the controller has answered ``registered``; all tasks were reported."""

    async def handle(self, message: dict) -> dict | None:
        """Carry out one order from the controller; returns an answer to send, or None."""

    def lease_renewed(self, expires: float | None, lease_s: float, grace_s: float) -> None:
        """The controller granted a lease until ``expires`` (monotonic clock); None: it grants none."""


class ControllerLink:
    """One WebSocket to ``url`` (or a channel from ``connect``), kept open for as long as :meth:`run` runs."""

    def __init__(self, url: str | list[str], key: str, owner: LinkOwner, *, reconnect_max_s: float = 10.0,
                 connect: Connector | None = None, ca: str | None = None) -> None:
        """``ca``: the CA file a wss:// controller's certificate is checked against (None: the system's CAs);
        a TlsFileError when it cannot be used."""
        # Several URLs: the controllers of one cluster, of which one leads. The link stays with the one that
        # took it, and tries the next when a connection fails or a standby answers 503.
        self.urls = [url] if isinstance(url, str) else list(url)
        self._at = 0
        self.term = 0  # the highest leader term heard; what an older term says is ignored
        self.ca = ca
        self._tls: Any = True  # aiohttp's own default: the system's CAs
        if any(u.startswith("wss://") for u in self.urls) and connect is None and ca is not None:
            from gpud.tls import client_context
            self._tls = client_context(ca)
        self._said = ""  # the last connection problem logged as an error, not repeated at every retry
        self.connect = connect
        self.key = key
        self.owner = owner
        self.reconnect_max_s = reconnect_max_s
        self.heartbeat_s = DEFAULT_HEARTBEAT_S
        self.connected = asyncio.Event()
        self.registrations = 0
        self._ws: Any = None  # the channel of the current connection
        self._send_lock = asyncio.Lock()
        self._heartbeat_now = asyncio.Event()
        self.lease_expires: float | None = None  # monotonic; None: no lease granted on this connection
        self.lease_s = 0.0
        self._seq = 0
        self._sent_at: dict[int, float] = {}  # heartbeats sent and not answered yet, by their seq
        self._dropping = False
        self._gave_up = False  # the last connection was dropped for unanswered heartbeats

    @property
    def url(self) -> str:
        """The controller URL the link uses now."""
        return self.urls[self._at]

    def _next_url(self, leader: str | None = None) -> bool:
        """Move to the leader a standby named (when it is one of ours), else to the next URL; True at a new round."""
        if leader:
            wanted = node_url(leader)
            if wanted in self.urls:
                self._at = self.urls.index(wanted)
                return False
        self._at = (self._at + 1) % len(self.urls)
        return self._at == 0

    async def send(self, message: dict) -> bool:
        """Send one message if registered with the controller; False when it could not be sent."""
        ws = self._ws
        if ws is None or ws.closed or not self.connected.is_set():
            return False
        try:
            async with self._send_lock:
                await ws.send_str(jsontext.dumps(message))
        except (ConnectionError, aiohttp.ClientError, RuntimeError):
            return False
        return True

    def heartbeat_soon(self) -> None:
        """Send a heartbeat now rather than at the next tick (after a GPU health change)."""
        self._heartbeat_now.set()

    async def run(self) -> None:
        """Connect, serve the connection until it drops, wait with backoff, and again, until cancelled."""
        backoff = FIRST_BACKOFF_S
        async with contextlib.AsyncExitStack() as stack:
            connect = self.connect
            if connect is None:
                connect = ws_connector(await stack.enter_async_context(aiohttp.ClientSession()),
                                       lambda: self.url, self.key, self._tls)
            while True:
                leader: str | None = None
                served = False
                try:
                    async with connect() as (channel, texts):
                        served = await self._serve(channel, texts)
                        if served:
                            backoff = FIRST_BACKOFF_S
                except aiohttp.WSServerHandshakeError as exc:
                    if exc.status in (401, 403):
                        log.error("the controller at %s refused this node's cluster key (HTTP %s)",
                                  self.url, exc.status)
                    elif exc.status == 503 and len(self.urls) > 1:
                        leader = exc.headers.get("X-Gpud-Leader") if exc.headers else None
                        log.info("the controller at %s is a standby (the leader: %s)", self.url, leader or "none yet")
                    else:
                        log.warning("cannot connect to the controller at %s: HTTP %s", self.url, exc.status)
                except aiohttp.ClientSSLError as exc:
                    self._tls_refused(exc)
                except aiohttp.ServerDisconnectedError as exc:
                    if not await self._serves_tls_only():
                        log.info("no controller at %s: %s", self.url, exc or type(exc).__name__)
                except aiohttp.ClientConnectorError as exc:
                    log.info("no controller at %s: %s", self.url, exc.os_error.strerror or exc.os_error)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                    log.info("no controller at %s: %s", self.url, exc or type(exc).__name__)
                finally:
                    self.connected.clear()
                    self._ws = None
                if _cancel_requested():
                    # Python 3.11's asyncio.wait_for swallows a cancel that races the connect's own outcome:
                    # without this the loop would reconnect forever and a stopping daemon would never stop.
                    raise asyncio.CancelledError
                if len(self.urls) > 1 and (not served or self._gave_up) and not self._next_url(leader):
                    await asyncio.sleep(FIRST_BACKOFF_S / 4)  # the next controller of the cluster, at once
                    continue
                await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
                # With several controllers a takeover is a few seconds' matter: look again often.
                backoff = min(backoff * 2, self.reconnect_max_s if len(self.urls) == 1 else
                              min(self.reconnect_max_s, 1.0))

    async def _serves_tls_only(self) -> bool:
        """Whether a ws:// URL names a controller that speaks TLS only; said as an error the first time."""
        parts = urlsplit(self.url)
        if parts.scheme != "ws" or not parts.hostname:
            return False
        from gpud.tls import speaks_tls
        if not await asyncio.to_thread(speaks_tls, parts.hostname, parts.port or 80, CONNECT_TIMEOUT_S):
            return False
        text = (f"the controller at {self.url} serves TLS only: set controller_url in node.toml (or --controller) "
                f"to https://{parts.netloc}")
        log.log(logging.INFO if text == self._said else logging.ERROR, "%s", text)
        self._said = text
        return True

    def _tls_refused(self, exc: aiohttp.ClientSSLError) -> None:
        """Say why the TLS handshake failed: as an error the first time, then quietly at each retry."""
        from gpud.tls import handshake_failure
        cause = getattr(exc, "certificate_error", None) or getattr(exc, "os_error", None) or exc
        text = handshake_failure(cause, self.url, self.ca)
        if isinstance(exc, aiohttp.ClientConnectorCertificateError):
            text += "; set ca_file in node.toml (or --ca-file) to the cluster's CA certificate"
        if text != self._said:
            log.error("%s; retrying", text)
            self._said = text
        else:
            log.info("%s", text)

    async def _serve(self, channel: Any, texts: AsyncIterator[str]) -> bool:
        """One connection; True when the node was registered on it."""
        self._ws = channel
        self._gave_up = False
        self.lease_expires, self._sent_at = None, {}
        register_sent = time.monotonic()
        await channel.send_str(jsontext.dumps(self.owner.register_message()))
        beating: asyncio.Task | None = None
        serving = asyncio.current_task()
        self._dropping = False
        try:
            async for text in texts:
                try:
                    message = jsontext.loads(text)
                except ValueError:
                    log.warning("ignoring a frame from the controller that is not JSON")
                    continue
                if not isinstance(message, dict):
                    continue
                if self._stale(message):
                    if message.get("type") == "registered":
                        break
                    continue
                if message.get("type") == "refused":
                    log.error("the controller at %s refused this node: %s", self.url, message.get("error"))
                    break
                if message.get("type") == "registered":
                    check = getattr(self.owner, "check_controller", None)
                    refused = check(message) if check is not None else None
                    if refused:
                        log.error("%s (controller at %s)", refused, self.url)
                        break
                    self._registered(message)
                    self._renew(register_sent, message)
                    if beating is None:
                        beating = asyncio.create_task(self._heartbeats(serving))
                    continue
                if message.get("type") == "lease":
                    sent = self._sent_at.pop(message.get("seq"), None)  # type: ignore[arg-type]
                    if sent is not None:
                        self._renew(sent, message)
                    continue
                await self._dispatch(message)
        except asyncio.CancelledError:
            if not self._dropping or serving is None:
                raise
            serving.uncancel()  # the heartbeats dropped a dead connection; the link itself goes on
            self._dropping = False
        finally:
            if beating is not None:
                beating.cancel()
                await asyncio.gather(beating, return_exceptions=True)
        log.info("the controller closed the connection")
        return beating is not None

    def _stale(self, message: dict) -> bool:
        """True when ``message`` comes from a leader of an older term than one already heard (it is ignored)."""
        term = message.get("term")
        if not isinstance(term, int) or isinstance(term, bool):
            return False
        if term < self.term:
            log.warning("ignoring %s from the controller at %s: its term %d is over (term %d leads)",
                        message.get("type"), self.url, term, self.term)
            return True
        self.term = term
        return False

    def _registered(self, message: dict) -> None:
        self._said = ""
        heartbeat = message.get("heartbeat_s")
        if isinstance(heartbeat, (int, float)) and not isinstance(heartbeat, bool) and heartbeat > 0:
            self.heartbeat_s = float(heartbeat)
        self.connected.set()
        self.registrations += 1
        self.owner.registered(message)
        log.info("registered with the controller at %s", self.url)

    def _renew(self, sent: float, message: dict) -> None:
        """Take the lease the controller granted in answer to what this node sent at ``sent``."""
        lease_s, grace_s = message.get("lease_s"), message.get("grace_s", 0.0)
        if not _positive(lease_s):
            self.lease_expires = None
            self.owner.lease_renewed(None, 0.0, 0.0)
            return
        expires = sent + float(lease_s)
        if self.lease_expires is None or expires > self.lease_expires:
            self.lease_expires, self.lease_s = expires, float(lease_s)
            self.owner.lease_renewed(expires, float(lease_s), float(grace_s) if _positive(grace_s) else 0.0)

    async def _dispatch(self, message: dict) -> None:
        try:
            answer = await self.owner.handle(message)
        except Exception:  # noqa: BLE001 - one bad order must not drop the connection
            log.exception("failed to carry out %s order", message.get("type"))
            return
        if answer is not None:
            await self.send(answer)

    async def _heartbeats(self, serving: asyncio.Task | None) -> None:
        while True:
            await wait_event(self._heartbeat_now, self.heartbeat_s)
            self._heartbeat_now.clear()
            now = time.monotonic()
            oldest = next(iter(self._sent_at.values()), now)
            # With several controllers, a leader that stopped answering (paused, or its host lost) is left for
            # the next one after a few heartbeats, long before the lease would run out.
            patience = self.lease_s + self.heartbeat_s if len(self.urls) == 1 else \
                min(self.lease_s + self.heartbeat_s, 3 * self.heartbeat_s + 2.0)
            if self.lease_expires is not None and len(self._sent_at) >= 2 and now - oldest > patience:
                # Heartbeats unanswered for longer than the lease: the connection is dead (a cut link can leave
                # it open for minutes); a new one gets through as soon as the link is back. (One unanswered
                # heartbeat may only mean this process was stopped: its answer is waiting to be read.)
                log.warning("no answer from the controller for %.0f s: this node's lease ran out; reconnecting",
                            now - oldest)
                self._gave_up = True
                if serving is not None:
                    self._dropping = True
                    serving.cancel()
                return
            self._seq += 1
            self._sent_at[self._seq] = now
            if len(self._sent_at) > KEPT_HEARTBEATS:
                del self._sent_at[next(iter(self._sent_at))]
            await self.send({**self.owner.heartbeat_message(), "seq": self._seq})


def ws_connector(session: aiohttp.ClientSession, url: str | Callable[[], str], key: str,
                 tls: Any = True) -> Connector:
    """How a node opens its WebSocket to ``url`` (or to what ``url()`` names at each connect: the controller a
    node follows may change) through ``session``, presenting the cluster ``key`` (``tls``: the SSL context
    checking a wss:// controller, or True for the system's CAs).

    Many links may share one session (an emulated fleet does; a node daemon has its own).
    """
    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[tuple[Any, AsyncIterator[str]]]:
        headers = {"Authorization": f"Bearer {key}"}
        target = url() if callable(url) else url
        ws = await asyncio.wait_for(session.ws_connect(target, headers=headers, heartbeat=30.0, ssl=tls,
                                                       timeout=aiohttp.ClientWSTimeout(ws_close=CLOSE_TIMEOUT_S)),
                                    CONNECT_TIMEOUT_S)
        async with ws:
            yield ws, ws_texts(ws)
    return connect


def node_url(base: str) -> str:
    """The WebSocket URL of the node endpoint of the controller at ``base`` (http:// or ws://)."""
    parts = urlsplit(base)
    scheme = {"http": "ws", "https": "wss"}.get(parts.scheme, parts.scheme)
    path = parts.path.rstrip("/")
    if not path.endswith("/api/v1/node/connect"):
        path += "/api/v1/node/connect"
    return f"{scheme}://{parts.netloc}{path}"


def _cancel_requested() -> bool:
    """True when the running task was asked to stop, even if a library swallowed the CancelledError."""
    task = asyncio.current_task()
    return task is not None and task.cancelling() > 0


def _positive(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
