"""The wire schema (gpud.wire): each message refuses bad JSON naming the field, and what it writes it reads back.

Random valid messages are drawn from the schema's own declarations, so a
field added to a message is covered without touching this file.
"""

from __future__ import annotations

import json
import string

import jsonschema_rs
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpud.controller import openapi
from gpud.wire import (ExitCause, JobRequest, MemorySliceSpec, RunState, TaskReport, TaskSpec, TaskStart, TaskStop,
                       TimeSlicingSpec, WireError)
from gpud.wire.fields import decode, encode, json_schema, rules
from hypothesis_budget import examples

MESSAGES = (JobRequest, TaskSpec, TaskStart, TaskStop, TaskReport, TimeSlicingSpec, MemorySliceSpec)
STRICT = {JobRequest}
TEXT = st.text(alphabet=string.ascii_letters + string.digits + "_-./ é", max_size=12)


def _bounded(rule, low_default: float, high_default: float) -> tuple[float, float]:
    low = rule.minimum if rule.minimum is not None else low_default
    if rule.above is not None:
        low = max(low, rule.above + 1e-6)
    high = rule.maximum if rule.maximum is not None else high_default
    return low, high


def _values(rule) -> st.SearchStrategy:
    """Valid values of one field, as the message holds them."""
    kind = rule.kind
    if kind == "text":
        if rule.choices:
            return st.sampled_from(rule.choices)
        if rule.absolute:
            return TEXT.map(lambda text: "/" + text)
        return TEXT.filter(lambda text: text or not rule.nonempty)
    if kind == "texts":
        return st.lists(TEXT, min_size=1 if rule.nonempty else 0, max_size=4).map(tuple)
    if kind == "map":
        return st.dictionaries(st.from_regex(r"[A-Z_][A-Z0-9_]{0,6}", fullmatch=True), TEXT, max_size=3)
    if kind == "flag":
        return st.booleans()
    if kind == "number":
        low, high = _bounded(rule, -1e9, 1e9)
        return st.floats(low, high, allow_nan=False, allow_infinity=False)
    if kind == "integer":
        low, high = _bounded(rule, -10**9, 10**9)
        return st.integers(int(low), int(high))
    if kind == "integers":
        low, high = _bounded(rule, 0, 10**6)
        return st.lists(st.integers(int(low), int(high)), max_size=4).map(tuple)
    if kind == "name_or_integer":
        low, high = _bounded(rule, -10**6, 10**6)
        return st.one_of(TEXT, st.integers(int(low), int(high)))
    if kind == "choice":
        return st.sampled_from(list(rule.of))
    assert kind == "message", kind
    return messages(rule.of)


@st.composite
def messages(draw, cls):
    """A valid message of type ``cls``: each field drawn from its rule (or left out), the whole checked."""
    values = {}
    for name, rule in rules(cls):
        if rule.required or draw(st.booleans()):
            values[name] = draw(_values(rule))
    if cls is TaskSpec:  # exactly one of command and script; a command's program is named
        values["command"], values["script"] = (draw(st.lists(TEXT.filter(bool), min_size=1, max_size=3).map(tuple)),
                                               None)
        values["stop_signal"] = draw(st.sampled_from(["TERM", "SIGINT", "usr1", "9"]))
        values["warn_signal"] = None
        values["job_uid"] = draw(st.sampled_from(["", "0123456789abcdef"]))
        values["env"] = {k: v for k, v in values.get("env", {}).items() if "\0" not in v}
    if cls is JobRequest:
        _pair_job_fields(draw, values)
    message = cls(**values)
    try:
        message.check()
    except WireError:
        assume(False)
    return message


def _pair_job_fields(draw, values: dict) -> None:
    """Make the fields of a job request that go together agree (JobRequest.check), each still drawn from its
    rule: drawn independently, nine requests in ten broke a pair and were thrown away."""
    field = dict(rules(JobRequest))
    if not (values.get("interactive") and draw(st.booleans())):
        keep = draw(st.sampled_from(["command", "script"]))
        if keep not in values:
            values[keep] = draw(_values(field[keep]))
        values.pop("script" if keep == "command" else "command", None)
        if keep == "command" and not values["command"]:
            values["command"] = (draw(TEXT),)
    else:
        values.pop("command", None), values.pop("script", None)
    if values.get("min_tasks") is not None:
        values["min_tasks"] = draw(st.integers(1, values.get("tasks", 1)))
    if values.get("gpus") and values.get("gpu_memory_gib") is not None:
        values.pop(draw(st.sampled_from(["gpus", "gpu_memory_gib"])))
    if values.get("gpus", 0) > 1:
        values["gpus"] = float(round(values["gpus"]))
    if values.get("warn_signal") is None:
        values.pop("warn_lead_s", None), values.pop("warn_batch_only", None)
    elif values.get("warn_lead_s") is None:
        values["warn_lead_s"] = draw(_values(field["warn_lead_s"]))


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda cls: cls.__name__)
@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_every_message_reads_back_what_it_writes_through_json_text(cls, data):
    message = data.draw(messages(cls))
    text = json.dumps(encode(message))
    assert decode(cls, json.loads(text), strict=cls in STRICT) == message


@pytest.mark.parametrize("cls", MESSAGES, ids=lambda cls: cls.__name__)
@settings(max_examples=examples(40), deadline=None, suppress_health_check=[HealthCheck.filter_too_much,
                                                                 HealthCheck.too_slow])
@given(data=st.data())
def test_what_a_message_writes_follows_its_json_schema(cls, data):
    message = data.draw(messages(cls))
    jsonschema_rs.validate(json_schema(cls, strict=cls in STRICT), encode(message))


def test_the_messages_own_writers_read_back():
    spec = TaskSpec(user="ann", workdir="/w", command=("python", "train.py"), env={"A": "1"}, gpu_indices=(0,),
                    time_slicing=TimeSlicingSpec(mode="fair", request=0.25, limit=0.5),
                    memory_slice=MemorySliceSpec(limit_mib=2048.0, env={"X": "y"}))
    start = TaskStart(job="7", task=1, attempt=2, spec=spec)
    assert start.to_json()["type"] == "start"
    assert TaskStart.decode(start.to_json()) == start
    assert TaskSpec.decode(spec.to_json()) == spec
    stop = TaskStop(job="7", task=1, attempt=2, reason="gpu memory: over", cause=ExitCause.GPU_MEMORY, grace_s=3.0)
    assert stop.to_json()["cause"] == "gpu_memory" and TaskStop.decode(stop.to_json()) == stop
    report = TaskReport(job="7", task=1, attempt=2, state=RunState.EXITED, exit_code=None, term_signal=9,
                        cause=ExitCause.OUT_OF_MEMORY, reason="out of memory (limit 1 GiB)")
    assert TaskReport.decode(report.to_json()) == report
    request = JobRequest(project="p", workdir="/w", command=("true",), gpus=0.5, depends=("afterok:3",))
    assert JobRequest.decode(request.to_json()) == request


GOOD_JOB = {"project": "p", "workdir": "/w", "command": ["true"]}


@pytest.mark.parametrize("change, field, status, words", [
    ({"gpus": "2"}, "gpus", 400, "gpus must be a number"),
    ({"tasks": 1.0}, "tasks", 400, "tasks must be an integer"),
    ({"tasks": 0}, "tasks", 422, "tasks must be an integer between 1 and 10000, not 0"),
    ({"cpus": -1}, "cpus", 422, "at least 0"),
    ({"memory_gib": 0}, "memory_gib", 422, "above 0"),
    ({"cpus": 10 ** 400}, "cpus", 422, "cpus is too large"),
    ({"cpus": float("nan")}, "cpus", 400, "cpus must be a number"),
    ({"hold": "yes"}, "hold", 400, "hold must be true or false"),
    ({"env": ["A=1"]}, "env", 400, "env must be an object of strings"),
    ({"command": ["echo", 1]}, "command", 400, "command must be a list of strings"),
    ({"name": "\ud800"}, "name", 400, "lone surrogate"),
    ({"name": "a\0b"}, "name", 422, "NUL"),
    ({"workdir": "rel"}, "workdir", 422, "workdir must be an absolute path, not 'rel'"),
    ({"workdir": None}, "workdir", 422, "workdir is required"),
    ({"stop_signal": "BOOM"}, "stop_signal", 422, "stop_signal must be one of TERM"),
    ({"priority": 10 ** 7}, "priority", 400, "a priority class name or an integer"),
    ({"partition": 7}, "partition", 400, "partition must be a partition name"),
    ({"projcet": "p"}, "projcet", 422, 'unknown field \'projcet\'; did you mean "project"?'),
    ({"script": "true"}, "command", 422, "exactly one of command"),
    ({"command": []}, "command", 422, "command must not be empty"),
    ({"min_tasks": 3, "tasks": 2}, "min_tasks", 422, "between 1 and 2"),
    ({"gpus": 1.5}, "gpus", 422, "whole number"),
    ({"warn_signal": "USR1"}, "warn_lead_s", 422, "warn_lead_s must be"),
])
def test_a_bad_job_request_names_the_field_with_its_status(change, field, status, words):
    with pytest.raises(WireError) as refused:
        JobRequest.decode({**GOOD_JOB, **change})
    assert (refused.value.field, refused.value.status) == (field, status), refused.value
    assert words in str(refused.value)


def test_a_job_request_normalises_signal_names_and_keeps_its_defaults():
    request = JobRequest.decode({**GOOD_JOB, "stop_signal": "SIGINT", "warn_signal": "SIGUSR2", "warn_lead_s": 30})
    assert (request.stop_signal, request.warn_signal, request.warn_lead_s) == ("INT", "USR2", 30.0)
    assert (request.tasks, request.cpus, request.requeue, request.priority) == (1, 1.0, True, None)
    with pytest.raises(WireError, match="a job must be a JSON object"):
        JobRequest.decode([GOOD_JOB])


GOOD_SPEC = {"user": "ann", "workdir": "/w", "command": ["true"]}


@pytest.mark.parametrize("change, field, words", [
    ({"user": ""}, "user", "user must not be empty"),
    ({"user": 3}, "user", "user must be a user name"),
    ({"command": None}, "command", "exactly one of command and script"),
    ({"command": [""]}, "command", "command must not be empty"),
    ({"env": {"A=B": "x"}}, "env", "env must map variable names"),
    ({"stop_signal": "NOPE"}, "stop_signal", "unknown signal 'NOPE'"),
    ({"job_uid": "XYZ"}, "job_uid", "16 to 64 lowercase hex digits"),
    ({"pids_max": 0}, "pids_max", "pids_max must be an integer of at least 1"),
    ({"gpu_indices": [0, True]}, "gpu_indices", "a list of integers"),
    ({"time_slicing": {"mode": "fast"}}, "time_slicing.mode", "time_slicing.mode must be one of off, strict, fair"),
    ({"time_slicing": {"mode": "fair", "request": 0.8, "limit": 0.5}}, "time_slicing.request", "above limit"),
    ({"time_slicing": "fair"}, "time_slicing", "time_slicing must be a JSON object"),
    ({"memory_slice": {"enforce": "yes"}}, "memory_slice.enforce", "memory_slice.enforce must be true or false"),
])
def test_a_bad_task_spec_names_the_field(change, field, words):
    with pytest.raises(WireError) as refused:
        TaskSpec.decode({**GOOD_SPEC, **change})
    assert refused.value.field == field, refused.value
    assert words in str(refused.value)


def test_an_interactive_task_spec_may_name_no_command_for_its_login_shell():
    assert TaskSpec.decode({"user": "ann", "workdir": "/w", "interactive": True}).command is None
    with pytest.raises(WireError, match="exactly one of command and script"):
        TaskSpec.decode({"user": "ann", "workdir": "/w"})


def test_a_task_spec_takes_fields_it_does_not_know_from_a_newer_controller():
    assert TaskSpec.decode({**GOOD_SPEC, "something_new": 1}).user == "ann"


@pytest.mark.parametrize("change, words", [
    ({"task": 10 ** 30}, "tasks[3]: task must be an integer"),
    ({"state": "exploded"}, "tasks[3]: state must be one of running, exited (got 'exploded')"),
    ({"cause": "bored"}, "tasks[3]: cause must be one of exited, timeout"),
    ({"cpu_s": -1}, "tasks[3]: cpu_s must be a number"),
    ({"job": ""}, "tasks[3]: job must not be empty"),
])
def test_a_bad_task_report_names_where_and_the_field(change, words):
    good = {"job": "1", "task": 0, "attempt": 0, "state": "exited", "cause": "timeout"}
    with pytest.raises(ValueError) as refused:
        TaskReport.decode({**good, **change}, "tasks[3]")
    assert words in str(refused.value)


def test_a_report_from_a_node_that_sends_no_cause_means_the_task_exited():
    report = TaskReport.decode({"job": "1", "task": 0, "attempt": 0, "state": "exited", "reason": "timeout"})
    assert report.cause is None and report.exit_cause is ExitCause.EXITED  # the words decide nothing


def test_only_the_node_failing_requeues_a_job():
    assert {cause for cause in ExitCause if cause.node_fault} == {
        ExitCause.SUPERVISOR_LOST, ExitCause.NO_SUPERVISOR, ExitCause.FENCED}


def test_the_openapi_job_object_is_the_wire_schema():
    schema = openapi.SCHEMAS["JobIn"]
    assert schema == json_schema(JobRequest, strict=True)
    assert schema["additionalProperties"] is False and schema["required"] == ["project", "workdir"]
    assert schema["properties"]["tasks"] == {"type": "integer", "minimum": 1, "maximum": 10000}
    jsonschema_rs.validate(schema, {**GOOD_JOB, "gpus": 0.5, "stop_signal": "SIGTERM"})
    with pytest.raises(jsonschema_rs.ValidationError):
        jsonschema_rs.validate(schema, {**GOOD_JOB, "bogus": 1})


def test_a_job_stored_before_exit_causes_loads_and_one_stored_now_keeps_its_cause():
    from gpud.jobs import Job
    from gpud.model import TaskPlacement
    job = Job(id="3", user="u", project="p", workdir="/w", command=["true"])
    job.runs[0].placement = TaskPlacement("n1", (0,), 1.0)
    job.runs[0].state, job.runs[0].reason, job.runs[0].cause = "exited", "timeout", ExitCause.TIMEOUT
    record = json.loads(json.dumps(job.to_record()))
    assert record["runs"][0]["cause"] == "timeout" and Job.from_record(record).runs[0].cause is ExitCause.TIMEOUT
    del record["runs"][0]["cause"]  # as the store holds a job written before causes were kept
    old = Job.from_record(record).runs[0]
    assert (old.state, old.reason, old.cause) == ("exited", "timeout", None)
