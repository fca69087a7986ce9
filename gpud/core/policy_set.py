"""The scheduler's policies, read once from the plugins: the objects the core calls for its orders and
placement strategies.

For each policy hook the core calls one object: the job order, the queue
order and the victim order (gpud.core.orders) and, for each strategy name,
a placement strategy (gpud.core.strategies). ``PolicySet`` makes them from
the hook's implementations, read once in pluggy's order (the last
registered first, as pluggy calls them):

- a plugin that is an object of the hook's policy class (``JobOrder``,
  ``QueueOrder``, ``VictimOrder``, ``Strategy``: the built-ins of
  gpud.policies are) is called through its method (``key``, ``candidates``,
  ``gpu_order``), compiled with the core for the built-ins; it always
  answers, so nothing after it is asked. A strategy object is passed by,
  without a call, for a strategy it does not name (``Strategy.names``);
- any other implementation is called as its function, with the arguments
  it takes, before the policy object; its None falls through to the next
  implementation, as in pluggy's first-result call;
- when the hook has a wrapper, or hook calls are traced
  (``gpud.core.hooks.traced``), every call of the hook goes through pluggy.

So a built-in costs the core a method call, and a plugin of one's own
costs its own calls. What a policy object declares (``JobOrder.priority_first``)
is read from the object the core calls: a job order with a plugin before
the built-in one declares nothing.
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator

from gpud.core.hooks import traced
from gpud.core.nodes import NodeIndex, NodeState
from gpud.core.orders import (AgedJobOrder, JobOrder, LeastLostWorkVictimOrder, PriorityJobOrder, PriorityVictimOrder,
                              QueueOrder, VictimOrder)
from gpud.core.queues import QueueState
from gpud.core.strategies import Strategy
from gpud.core.victim import Victim
from gpud.model import JobSpec, Resources, TaskRequest


class PolicySet:
    """The job order, the queue order, the victim order and the placement strategies, as the core calls them."""

    def __init__(self, pm: Any, youngest_first: bool = False, age_weight: float = 0.0) -> None:
        """Read the plugins; with ``youngest_first`` (the policy's ``victim_order``), the youngest-first
        order stands in for the built-in least-lost-work victim order, and with an ``age_weight`` above 0
        the aged order (``AgedJobOrder``) for the built-in job order."""
        self._pm = pm
        hook = pm.hook
        asked, job_order, alone = _read(hook.gpud_job_order_key, pm, JobOrder, "")
        # Aging is the built-in order's: an order of one's own, even one made from it, keeps its keys.
        if age_weight > 0 and isinstance(job_order, PriorityJobOrder) and type(job_order).key is PriorityJobOrder.key:
            job_order = AgedJobOrder(age_weight)
            alone = job_order if alone is not None else None
        self.job_order: JobOrder = (job_order if job_order is not None and not asked
                                    else _AskedJobOrder(asked, job_order, alone))
        asked, queue_order, _ = _read(hook.gpud_queue_order_key, pm, QueueOrder, "")
        self.queue_order: QueueOrder = (queue_order if queue_order is not None and not asked
                                        else _AskedQueueOrder(asked, queue_order))
        asked, victim_order, alone_order = _read(hook.gpud_victim_order_key, pm, VictimOrder, "")
        if youngest_first and isinstance(victim_order, LeastLostWorkVictimOrder):
            victim_order = PriorityVictimOrder()
        elif youngest_first and isinstance(alone_order, LeastLostWorkVictimOrder):
            # Only the built-in order would answer, through pluggy: the youngest-first order answers instead.
            victim_order, asked, alone_order = PriorityVictimOrder(), [], None
        self.victim_order: VictimOrder = (victim_order if victim_order is not None and not asked
                                          else _AskedVictimOrder(asked, victim_order, alone_order))
        self._strategies: dict[str, Strategy] = {}

    def strategy(self, name: str) -> Strategy:
        """The placement strategy ``name`` (a pool's ``placement``, ``cpu_placement`` or ``gpu_placement``),
        whose ``candidates`` and ``gpu_order`` answer the placement hooks for it; read once per name.

        Where no plugin answers, ``candidates`` gives None (no node) and
        ``gpu_order`` None (the lowest free GPUs).
        """
        found = self._strategies.get(name)
        if found is None:
            hook = self._pm.hook
            asked, candidates, _ = _read(hook.gpud_node_candidates, self._pm, Strategy, name)
            asked_gpus, gpu_order, _ = _read(hook.gpud_gpu_order, self._pm, Strategy, name)
            if not asked and not asked_gpus and candidates is not None and candidates is gpu_order:
                found = candidates
            else:
                found = _AskedStrategy(name, asked, candidates, asked_gpus, gpu_order)
            self._strategies[name] = found
        return found


class _Ask:
    """One implementation of a first-result hook, called with the hook's arguments it takes."""

    def __init__(self, function: Any, picks: list[int] | None) -> None:
        self.function = function
        self.picks = picks  # positions in the hook's arguments of those the function takes; None: all, in order

    def call(self, args: tuple) -> Any:
        """The implementation's answer (None: it leaves the answer to the next)."""
        picks = self.picks
        if picks is None:
            return self.function(*args)
        return self.function(*[args[i] for i in picks])


class _AskPluggy(_Ask):
    """The whole hook, called through pluggy (wrappers, tracing): every implementation as pluggy calls it."""

    def __init__(self, caller: Any, names: tuple[str, ...]) -> None:
        super().__init__(caller, None)
        self.names = names

    def call(self, args: tuple) -> Any:
        """pluggy's answer."""
        return self.function(**dict(zip(self.names, args)))


def _read(caller: Any, pm: Any, kind: type, name: str) -> tuple[list[_Ask], Any, Any]:
    """How to answer a hook: the implementations to ask in turn, then the first policy object of
    ``kind`` (that names strategy ``name``, for a strategy) or None when no such object answers; and
    the policy object whose answer is always the hook's, or None.

    With a wrapper or with traced hook calls, the one thing to ask is pluggy's
    whole call; the policy object alone still gives every answer when no
    wrapper or other plugin comes before it.
    """
    impls = caller.get_hookimpls()
    names = tuple(caller.spec.argnames)
    asked: list[_Ask] = []
    found = None
    for impl in reversed(impls):
        plugin = impl.plugin
        if isinstance(plugin, kind):
            if not name or isinstance(plugin, Strategy) and name in plugin.names:
                found = plugin
                break
            continue  # its hook method leaves other strategies to the next plugin
        takes = tuple(impl.argnames)
        asked.append(_Ask(impl.function, None if takes == names else [names.index(arg) for arg in takes]))
    wrapped = any(impl.hookwrapper or impl.wrapper for impl in impls)
    alone = found if not asked and not wrapped else None
    if wrapped or traced(pm):
        return [_AskPluggy(caller, names)], None, alone
    return asked, found, alone


def _first(asked: list[_Ask], args: tuple) -> Any:
    """The first answer other than None of ``asked``, or None."""
    for ask in asked:
        found = ask.call(args)
        if found is not None:
            return found
    return None


class _AskedJobOrder(JobOrder):
    """A job order with plugins asked before the job-order object (or with none)."""

    def __init__(self, asked: list[_Ask], then: JobOrder | None, alone: JobOrder | None) -> None:
        self.asked = asked
        self.then = then
        self.alone = alone  # the job-order object that gives every key, though asked through pluggy

    @property
    def priority_first(self) -> bool:
        """As the job-order object that gives every key declares; else False."""
        return self.alone is not None and self.alone.priority_first

    def key(self, job: JobSpec) -> Any:
        """The first plugin's key that is not None, else the job-order object's."""
        found = _first(self.asked, (job,))
        if found is None and self.then is not None:
            return self.then.key(job)
        return found


class _AskedQueueOrder(QueueOrder):
    """A queue order with plugins asked before the queue-order object (or with none)."""

    def __init__(self, asked: list[_Ask], then: QueueOrder | None) -> None:
        self.asked = asked
        self.then = then

    def key(self, queue: QueueState, job: JobSpec, need: Resources) -> Any:
        """The first plugin's key that is not None, else the queue-order object's."""
        found = _first(self.asked, (queue, job, need))
        if found is None and self.then is not None:
            return self.then.key(queue, job, need)
        return found


class _AskedVictimOrder(VictimOrder):
    """A victim order with plugins asked before the victim-order object (or with none)."""

    def __init__(self, asked: list[_Ask], then: VictimOrder | None, alone: VictimOrder | None) -> None:
        self.asked = asked
        self.then = then
        self.alone = alone  # the victim-order object that gives every key, though asked through pluggy

    @property
    def weighs_lost_work(self) -> bool:
        """As the victim-order object that gives every key declares; else False."""
        return self.alone is not None and self.alone.weighs_lost_work

    def key(self, victim: Victim) -> Any:
        """The first plugin's key that is not None, else the victim-order object's."""
        found = _first(self.asked, (victim,))
        if found is None and self.then is not None:
            return self.then.key(victim)
        return found


class _AskedStrategy(Strategy):
    """A strategy with plugins asked before the strategy objects that name it (or with none), hook by hook."""

    def __init__(self, name: str, asked: list[_Ask], candidates: Strategy | None,
                 asked_gpus: list[_Ask], gpu_order: Strategy | None) -> None:
        super().__init__((name,))
        self.asked = asked
        self.then = candidates
        self.asked_gpus = asked_gpus
        self.then_gpus = gpu_order

    def candidates(self, strategy: str, request: TaskRequest, index: NodeIndex) -> Iterator[NodeState] | None:
        """The first plugin's answer that is not None, else the strategy object's."""
        found = _first(self.asked, (strategy, request, index))
        if found is None and self.then is not None:
            return self.then.candidates(strategy, request, index)
        return found  # type: ignore[no-any-return]

    def gpu_order(self, strategy: str, request: TaskRequest, node: NodeState) -> Iterable[int] | None:
        """The first plugin's answer that is not None, else the strategy object's."""
        found = _first(self.asked_gpus, (strategy, request, node))
        if found is None and self.then_gpus is not None:
            return self.then_gpus.gpu_order(strategy, request, node)
        return found  # type: ignore[no-any-return]
