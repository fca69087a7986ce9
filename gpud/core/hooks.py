"""Fast callers for first-result hooks on the scheduler's hot path."""

from __future__ import annotations

from typing import Any, Callable

TRACING = "gpud_tracing"
NATIVE = "gpud_native"  # the attribute by which a plugin function names the core function it answers with
ANSWERS = "gpud_answers"  # the attribute by which a strategy hook's function names the strategies it answers for


def first_result(caller: Any, pm: Any) -> Callable[..., Any]:
    """A callable with the hook's first-result meaning, cheaper than pluggy's dispatch.

    Without wrappers (and with hook tracing off for ``pm``) the
    implementations are called directly, in pluggy's order, up to the first
    that answers; when none answers, the full hook call is made.
    """
    impls = caller.get_hookimpls()
    if not impls or any(i.hookwrapper or i.wrapper for i in impls) or getattr(pm, TRACING, False):
        return caller
    if len(impls) == 1:
        function = impls[0].function
        names = tuple(impls[0].argnames)
        spec = caller.spec
        if spec is not None and names == tuple(spec.argnames):
            # It takes every argument by its name, and its None is the hook's None: call it as it is,
            # or the core function it answers with (gpud.core.orders), which it names for that.
            return getattr(function, NATIVE, function)  # type: ignore[no-any-return]
        if len(names) == 1:
            name = names[0]

            def call_one(**kwargs: Any) -> Any:
                result = function(kwargs[name])
                return caller(**kwargs) if result is None else result

            return call_one

        def call(**kwargs: Any) -> Any:
            result = function(*[kwargs[name] for name in names])
            return caller(**kwargs) if result is None else result

        return call
    ordered = [(i.function, tuple(i.argnames)) for i in reversed(impls)]

    def call_each(**kwargs: Any) -> Any:
        for function, names in ordered:
            result = function(*[kwargs[name] for name in names])
            if result is not None:
                return result
        return caller(**kwargs)

    return call_each


def strategy_function(caller: Any, pm: Any, strategy: str) -> Callable[..., Any] | None:
    """The core function that alone answers a placement hook for ``strategy``, or None.

    The implementations are read in pluggy's order: each must name the
    strategies it answers for (``ANSWERS``; it returns None for the others)
    until one names ``strategy``, and that one must name its core function
    (``NATIVE``), which takes the hook's arguments after the strategy, by
    position. Otherwise (a plugin that does not say, wrappers, tracing) the
    hook is to be called as usual.
    """
    impls = caller.get_hookimpls()
    if any(i.hookwrapper or i.wrapper for i in impls) or getattr(pm, TRACING, False):
        return None
    for impl in reversed(impls):
        answers = getattr(impl.function, ANSWERS, None)
        if answers is None:
            return None
        if strategy in answers:
            return getattr(impl.function, NATIVE, None)  # type: ignore[no-any-return]
    return None


def has_implementations(caller: Any) -> bool:
    """True when some registered plugin implements the hook."""
    return bool(caller.get_hookimpls())
