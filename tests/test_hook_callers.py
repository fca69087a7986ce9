"""The core's fast callers of first-result hooks answer exactly as pluggy's own hook call does."""

from __future__ import annotations

import pluggy
import pytest

from gpud import hookimpl, hookspecs
from gpud.core.hooks import first_result


def manager(*plugins: object) -> pluggy.PluginManager:
    pm = pluggy.PluginManager("gpud")
    pm.add_hookspecs(hookspecs)
    for plugin in plugins:
        pm.register(plugin)
    return pm


class ByPriority:
    @hookimpl
    def gpud_job_order_key(self, job):
        return ("priority", job)


class Abstains:
    @hookimpl
    def gpud_job_order_key(self, job):
        return None


class QueueOnly:
    """Takes fewer arguments than the hook gives."""

    @hookimpl
    def gpud_queue_order_key(self, queue):
        return ("queue", queue)


class Wrapper:
    @hookimpl(wrapper=True)
    def gpud_job_order_key(self, job):
        result = yield
        return ("wrapped", result)


@pytest.mark.parametrize("plugins", [
    (ByPriority(),),
    (Abstains(),),
    (ByPriority(), Abstains()),  # the last registered is asked first, abstains, and the other answers
    (Abstains(), ByPriority()),
    (ByPriority(), Wrapper()),
], ids=["one", "one that abstains", "abstains first", "answers first", "with a wrapper"])
def test_the_job_order_key_is_what_pluggy_answers(plugins):
    pm = manager(*plugins)
    assert first_result(pm.hook.gpud_job_order_key, pm)(job="j1") == pm.hook.gpud_job_order_key(job="j1")


def test_a_plugin_taking_fewer_arguments_gets_only_those():
    pm = manager(QueueOnly())
    key = first_result(pm.hook.gpud_queue_order_key, pm)
    assert key(queue="q1", job="j1", need=None) == ("queue", "q1")


def test_a_wrapper_still_runs():
    pm = manager(ByPriority(), Wrapper())
    assert first_result(pm.hook.gpud_job_order_key, pm)(job="j1") == ("wrapped", ("priority", "j1"))
