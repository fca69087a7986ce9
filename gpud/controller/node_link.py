"""The node daemons' WebSocket (docs/api.md): register, heartbeats and task reports in; commands out."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from typing import TYPE_CHECKING, Any, AsyncContextManager, AsyncIterator, Callable

from aiohttp import web

from gpud import jsontext
from gpud.channel import LocalEnd, local_pair, ws_texts
from gpud.controller import node_schema
from gpud.controller.interactive import hub_of
from gpud.controller.keys import CONTROLLER
from gpud.controller.nodes import NodeRecord, gpus_from_report
from gpud.controller.slices import loop_turns

if TYPE_CHECKING:
    from gpud.controller.service import Controller

_JOB_UID = re.compile(r"^[0-9a-f]{16,64}$")  # as gpud.jobs makes them
log = logging.getLogger("gpud.controller")
MAX_MESSAGE = 64 * 1024 * 1024
LOCAL_CLOSE_WAIT_S = 5.0  # how long a closing in-process node waits for the controller side to finish


def node_from_register(message: dict, peer: str) -> NodeRecord:
    """The node's record from its register message; ValueError names the malformed field."""
    name = message.get("node")
    if not isinstance(name, str) or not name or len(name) > 255:
        raise ValueError("register needs the node's name")
    labels = message.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ValueError("labels must be an object of strings")
    cpus, memory = node_schema.quantity(message, "cpus"), node_schema.quantity(message, "memory_gib")
    pool = message.get("pool") or labels.get("pool") or "default"
    limits = message.get("limits") or {}
    if not isinstance(limits, dict) or not isinstance(limits.get("enforced", []), list):
        raise ValueError("limits must be an object with a list of what is enforced")
    measures = limits.get("gpu_measures")
    if measures is not None and not isinstance(measures, list):
        raise ValueError("limits.gpu_measures must be a list of what the node measures on its GPUs")
    return NodeRecord(name=name, pool=str(pool), labels=dict(labels), cpus=cpus, memory_gib=memory,
                      gpus=gpus_from_report(message.get("gpus", [])),
                      address=str(message.get("address") or peer),
                      limits=[str(item) for item in limits.get("enforced", [])], limits_how=str(limits.get("how", "")),
                      gpu_measures=None if measures is None else [str(item) for item in measures])


def _lease(ctrl: Controller) -> dict:
    """The lease granted with each answer: the node stops its tasks if it hears nothing for ``lease_s``."""
    lease = {"lease_s": ctrl.config.node_timeout_s, "grace_s": ctrl.cluster.policy.grace_period_s}
    if ctrl.term is not None:
        lease["term"] = ctrl.term  # a node ignores what a controller of an older term says
    return lease


def _tasks(message: dict) -> list[dict]:
    return node_schema.task_reports(message.get("tasks"))


async def node_connect(request: web.Request) -> web.WebSocketResponse:
    """One node's connection, for as long as it lasts."""
    ws = web.WebSocketResponse(max_msg_size=MAX_MESSAGE, heartbeat=30.0)
    # The upgrade takes its turn as a node message does: a fleet reconnecting at once (a controller restarted)
    # opens thousands of connections within seconds.
    turns = loop_turns()
    began = await turns.enter()
    try:
        await ws.prepare(request)
    finally:
        turns.leave(began)
    await serve_node(request.app[CONTROLLER], ws, ws_texts(ws), request.remote or "")
    return ws


def connect_in_process(ctrl: Controller) -> Callable[[], AsyncContextManager[tuple[LocalEnd, AsyncIterator[str]]]]:
    """How a node agent in the controller's own process (gpud up) connects: an in-memory channel, no key needed.

    Each connection is served by :func:`serve_node` exactly as a WebSocket
    from another host would be.
    """
    async def serve(channel: LocalEnd) -> None:
        try:
            await serve_node(ctrl, channel, channel.texts(), "127.0.0.1")
        except Exception:  # as a WebSocket handler's failure would, it ends the connection; the node reconnects
            log.exception("serving the node failed; closing its connection")
        finally:
            await channel.close()

    @contextlib.asynccontextmanager
    async def connect() -> AsyncIterator[tuple[LocalEnd, AsyncIterator[str]]]:
        node_end, controller_end = local_pair()
        serving = asyncio.create_task(serve(controller_end), name="gpud-local-node")
        try:
            yield node_end, node_end.texts()
        finally:
            await node_end.close()
            # Serving ends once it reads the close; a node going away never waits on it for long.
            done, _ = await asyncio.wait({serving}, timeout=LOCAL_CLOSE_WAIT_S)
            if not done:
                log.warning("serving the in-process node did not end with its connection; cancelling it")
                serving.cancel()
                await asyncio.gather(serving, return_exceptions=True)
    return connect


async def serve_node(ctrl: Controller, channel: Any, texts: AsyncIterator[str], peer: str) -> None:
    """Serve one node's messages from ``texts`` (answers and commands go out on ``channel``) until they end."""
    node = _NodeConversation(ctrl, channel, peer)
    turns = loop_turns()
    try:
        async for text in texts:
            # Each message takes its turn on the loop (gpud/controller/slices.py): a burst leaves it free between.
            began = await turns.enter()
            try:
                if not await node.serve(text):
                    return
            finally:
                turns.leave(began)
    finally:
        name = node.name
        if name is not None and ctrl.links.get(name) is channel:
            del ctrl.links[name]
            ctrl.cluster.node_messages.disconnected(name)


class _NodeConversation:
    """What the controller remembers of one node's connection between its messages.

    Only this stays alive while the connection waits for the next message
    (seconds, for each of thousands of nodes): each message, and everything
    read from it, is let go once served, so the garbage collector's passes
    do not walk them meanwhile.
    """

    __slots__ = ("ctrl", "channel", "peer", "name", "gpus_seen", "tasks_seen")

    def __init__(self, ctrl: Controller, channel: Any, peer: str) -> None:
        self.ctrl = ctrl
        self.channel = channel
        self.peer = peer
        self.name: str | None = None
        self.gpus_seen: Any = None  # the GPUs as the node last reported them: a heartbeat saying the same is not parsed again
        self.tasks_seen: list[dict] = []  # its last task reports, checked: those a heartbeat repeats are not checked again

    async def serve(self, text: str) -> bool:
        """Serve one message; False when the connection is to end."""
        ctrl, channel, name = self.ctrl, self.channel, self.name
        try:
            message = node_schema.loads_message(text)
            kind = message.get("type")
            if kind == "register":
                theirs = message.get("cluster_id")
                if isinstance(theirs, str) and theirs and theirs != ctrl.cluster_id:
                    log.warning("refused node %r of another cluster (%s; this is %s)", message.get("node"),
                                theirs, ctrl.cluster_id)
                    await channel.send_str(jsontext.dumps({
                        "type": "refused", "error": f"this controller serves cluster {ctrl.cluster_id}, and "
                                                    f"this node belongs to cluster {theirs}"}))
                    return False
                node = node_from_register(message, self.peer)
                tasks = _tasks(message)
                old = ctrl.links.get(node.name)
                if old is not None and old is not channel:
                    await old.close()
                self.name = node.name
                registered = {"type": "registered", "heartbeat_s": ctrl.config.heartbeat_s,
                              "cluster_id": ctrl.cluster_id, **_lease(ctrl)}
                await channel.send_str(jsontext.dumps(registered))
                ctrl.links[node.name] = channel
                ctrl.cluster.node_messages.register(node, tasks, checkpoints=_checkpoints(message))
                self.gpus_seen, self.tasks_seen = message.get("gpus", []), tasks
            elif name is None:
                raise ValueError("register first")
            elif kind == "heartbeat":
                gpus = None
                if "gpus" in message and message["gpus"] != self.gpus_seen:
                    gpus = gpus_from_report(message["gpus"])
                tasks = node_schema.task_reports(message.get("tasks"), checked=self.tasks_seen)
                self.tasks_seen = tasks
                if gpus is not None:
                    self.gpus_seen = message["gpus"]
                made = ctrl.cluster.outbox.made
                ctrl.cluster.node_messages.heartbeat(name, gpus, tasks)
                if "seq" in message:
                    await channel.send_str(jsontext.dumps({"type": "lease", "seq": message["seq"],
                                                           **_lease(ctrl)}))
                if ctrl.cluster.outbox.made == made:
                    ctrl.persist.flush_soon()  # nothing to send: its changes go with the next batch
                    return True
            elif kind == "task":
                node_schema.task_report(message, "task")
                ctrl.cluster.nodes[name].last_seen = ctrl.cluster.clock()
                if not ctrl.cluster.node_messages.task_report(name, message):
                    return True  # nothing waits for its changes to be durable
            elif isinstance(kind, str) and kind.startswith(("pty_", "fwd_", "interactive_")):
                hub_of(ctrl).from_node(name, message)
                return True
            elif kind == "checkpointed":
                if not ctrl.cluster.plans.checkpoint_marked(name, message):
                    return True
            elif kind == "log":
                future = ctrl.log_requests.get(str(message.get("request")))
                if future is not None and not future.done():
                    future.set_result(message)
                return True
            else:
                raise ValueError(f"unknown message type {kind!r}")
        except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
            log.warning("node %s: bad message: %s", name or self.peer, exc)
            await channel.send_str(jsontext.dumps({"type": "error", "error": f"bad message: {exc}"}))
            return True
        ctrl.commit_soon()
        return True


def _checkpoints(message: dict) -> list[str]:
    """The job uids whose checkpoint directories a registering node holds (entries that are not uids are left out)."""
    found = message.get("checkpoints")
    if not isinstance(found, list):
        return []
    return [uid for uid in found if isinstance(uid, str) and _JOB_UID.match(uid)]
