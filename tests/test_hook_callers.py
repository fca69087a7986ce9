"""The core's fast callers of first-result hooks answer exactly as pluggy's own hook call does."""

from __future__ import annotations

import pluggy
import pytest

from gpud import hookimpl, hookspecs
from gpud.core.hooks import first_result
from gpud.core.orders import job_order_key, queue_order_key, victim_order_key
from gpud.model import JobSpec, TaskRequest
from gpud.plugins import make_plugin_manager


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


def test_a_built_in_order_alone_is_called_as_its_core_function_and_answers_the_same():
    pm = make_plugin_manager(load_entry_points=False)
    assert first_result(pm.hook.gpud_job_order_key, pm) is job_order_key
    assert first_result(pm.hook.gpud_queue_order_key, pm) is queue_order_key
    assert first_result(pm.hook.gpud_victim_order_key, pm) is victim_order_key
    job = JobSpec("j1", "p1", TaskRequest(1), priority=75, submitted=3.0, seq=7)
    assert job_order_key(job=job) == pm.hook.gpud_job_order_key(job=job) == (-75, 3.0, 7, "j1")


def test_a_plugin_of_ones_own_beside_a_built_in_order_is_asked_first():
    pm = make_plugin_manager(load_entry_points=False)
    pm.register(ByPriority())
    assert first_result(pm.hook.gpud_job_order_key, pm)(job="j1") == ("priority", "j1")
