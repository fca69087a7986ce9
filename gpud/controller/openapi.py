"""The controller's API description, OpenAPI 3.1, served at /api/v1/openapi.json.

Written here as data next to the handlers it describes; tests check that
it names every route the application serves (and no other), that its job
object is the wire schema's job request (gpud.wire.job), and a property-based
fuzzer (schemathesis) checks every answer against it on a real controller.
"""

from __future__ import annotations

from typing import Any

from gpud import __version__
from gpud.controller.job_reason import REASON_CODES
from gpud.lifecycle import STATES
from gpud.wire.job import job_request_schema

PATH = "/api/v1/openapi.json"
UNDESCRIBED = frozenset({"/api/v1/node/connect"})  # the node WebSocket: docs/api.md describes its messages

NUM = {"type": "number"}
INT = {"type": "integer"}
STR = {"type": "string"}
BOOL = {"type": "boolean"}
STRINGS = {"type": "array", "items": STR}
STR_MAP = {"type": "object", "additionalProperties": STR}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


JOB_IN = job_request_schema()  # gpud.wire.job declares every field once

PLACEMENT = {"type": "object", "required": ["node", "gpus", "share"],
             "properties": {"node": STR, "gpus": {"type": "array", "items": INT}, "share": NUM,
                            "gpu_uuids": STRINGS, "state": STR, "attempt": INT}}

JOB_OUT = {
    "type": "object", "required": ["id", "name", "user", "project", "state", "reason"],
    "properties": {
        "id": STR, "name": STR, "user": STR, "project": STR, "state": {"enum": list(STATES)}, "reason": STR,
        "reason_code": _nullable({"enum": list(REASON_CODES)}), "reason_short": STR, "priority_class": STR, "priority": NUM, "gpus": NUM, "gpu_memory_gib": _nullable(NUM), "tasks": INT,
        "min_tasks": _nullable(INT), "cpus": NUM, "memory_gib": NUM, "constraint": STR_MAP,
        "pool": _nullable(STR), "workdir": _nullable(STR), "command": _nullable(STRINGS),
        "script": _nullable(STR), "env": _nullable(STR_MAP), "time_limit_s": _nullable(NUM), "array_id": _nullable(STR), "array_index": _nullable(INT),
        "array_limit": _nullable(INT), "depends": STRINGS, "hold": BOOL, "requeue": BOOL, "stop_signal": STR,
        "output": _nullable(STR), "error": _nullable(STR), "submitted": NUM, "started": _nullable(NUM),
        "ended": _nullable(NUM), "restart_count": INT, "exit_code": _nullable(INT), "term_signal": _nullable(INT),
        "nodes": STRINGS, "placements": {"type": "array", "items": _nullable(PLACEMENT)}, "gpu_hours": NUM,
        "gpu_compute_request": _nullable(NUM), "gpu_compute_limit": _nullable(NUM),
        "sharing": _nullable({"type": "object"}), "elapsed_s": NUM, "interactive": BOOL, "confidential": BOOL,
        "estimated_start": _nullable(NUM), "reserved_start": _nullable(NUM), "start_nodes": STRINGS,
        "no_estimate": _nullable(STR),
        "array": {"type": "object"}, "elements": {"type": "array", "items": {"type": "object"}},
        "events": {"type": "array", "items": {"type": "object", "required": ["time", "kind", "message"],
                                              "properties": {"time": NUM, "kind": STR, "message": STR,
                                                             "node": _nullable(STR)}}},
    },
}

RESOURCES = {"type": "object", "properties": {k: _nullable(NUM) for k in ("gpu", "cpu", "memory")}}

SCHEMAS: dict[str, Any] = {
    "Error": {"type": "object", "required": ["error"],
              "properties": {"error": {"type": "string", "minLength": 1}, "field": STR, "index": INT,
                             "job": STR}},
    "JobIn": JOB_IN,
    "Job": JOB_OUT,
    "Ids": {"type": "object", "required": ["ids"], "properties": {"ids": STRINGS, "array_id": STR,
                                                                     "notes": {"type": "array", "items": STR_MAP}}},
    "Jobs": {"type": "object", "required": ["jobs"], "properties": {"jobs": {"type": "array", "items": _ref("Job")},
                                                                    "arrays": {"type": "object"}}},
    # A listed job: every field of a Job, or only those the listing's ``fields`` names.
    "ListedJob": {key: value for key, value in JOB_OUT.items() if key != "required"},
    "JobPage": {"type": "object", "required": ["jobs", "arrays", "next_cursor"],
                "properties": {"jobs": {"type": "array", "items": _ref("ListedJob")}, "arrays": {"type": "object"},
                               "next_cursor": {"type": ["string", "null"]}}},
    "Token": {"type": "object", "required": ["id", "user", "admin", "allow_root", "created"],
              "properties": {"id": STR, "user": STR, "admin": BOOL, "allow_root": BOOL, "created": NUM}},
    "Session": {"type": "object", "required": ["job", "nodes", "interactive"],
                "properties": {"job": STR, "nodes": STRINGS, "interactive": BOOL}},
    "Node": {"type": "object", "required": ["name", "state", "gpus"],
             "properties": {"name": STR, "pool": STR, "state": {"enum": ["up", "drained", "draining", "down"]},
                            "reason": _nullable(STR), "labels": STR_MAP, "cpus": NUM, "memory_gib": NUM,
                            "gpus": {"type": "array", "items": {"type": "object"}}, "gpus_used": NUM,
                            "gpus_idle": NUM, "address": _nullable(STR), "last_seen": NUM,
                            "seconds_since_heartbeat": NUM}},
    "Queue": {"type": "object", "required": ["name", "kind", "pool"],
              "properties": {"name": STR, "kind": {"enum": ["project", "department"]}, "pool": STR,
                             "department": _nullable(STR), "quota": RESOURCES, "fair_share": RESOURCES,
                             "allocated": RESOURCES, "demand": RESOURCES, "pending_jobs": INT,
                             "running_jobs": INT}},
}


def _json(schema: dict) -> dict:
    return {"application/json": {"schema": schema}}


def _answer(status: str, description: str, schema: dict | None = None, **more: Any) -> dict:
    answers = {status: {"description": description, **({"content": _json(schema)} if schema else {})}}
    for code, text in more.items():
        answers[code.strip("_")] = {"description": text, "content": _json(_ref("Error"))}
    answers["4XX"] = {"description": "refused: the message says why", "content": _json(_ref("Error"))}
    return answers


def _query(name: str, schema: dict, description: str) -> dict:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def _path(name: str, description: str) -> dict:
    return {"name": name, "in": "path", "required": True, "schema": STR, "description": description}


JOB_ID = _path("id", "a job id (42), an array element (42_7), or an array id")
IDEMPOTENCY = {"name": "Idempotency-Key", "in": "header", "required": False,
               "schema": {"type": "string", "minLength": 1, "maxLength": 255},
               "description": "the same key (per user, kept 24 h) gets the first answer, never a second job"}


def _op(summary: str, answers: dict, *, body: dict | None = None, params: list | None = None,
        public: bool = False) -> dict:
    op: dict[str, Any] = {"summary": summary, "responses": answers}
    if body is not None:
        op["requestBody"] = {"required": True, "content": _json(body)}
    if params:
        op["parameters"] = params
    if public:
        op["security"] = []
    return op


def _session(summary: str, params: list) -> dict:
    """A WebSocket endpoint: 101 when upgraded; without the upgrade, the checks' answer (docs/api.md)."""
    answers = _answer("200", "the caller may open it (no upgrade was asked for)", _ref("Session"))
    answers["101"] = {"description": "upgraded to a WebSocket"}
    answers["503"] = {"description": "the node is not connected", "content": _json(_ref("Error"))}
    answers["504"] = {"description": "the node did not answer", "content": _json(_ref("Error"))}
    return {"get": _op(summary, answers, params=[JOB_ID, *params])}


TERMINAL = [_query("rows", {"type": "integer", "minimum": 1, "maximum": 9999}, "terminal rows"),
            _query("cols", {"type": "integer", "minimum": 1, "maximum": 9999}, "terminal columns"),
            _query("term", STR, "TERM, such as xterm-256color")]
TASK = _query("task", {"type": "integer", "minimum": 0}, "the task index (0)")


def _change(verb: str) -> dict:
    return {"post": _op(f"{verb} a job, or every element of an array", _answer("200", f"the ids {verb}", _ref("Ids")),
                        params=[JOB_ID])}


PATHS: dict[str, Any] = {
    "/healthz": {"get": _op("liveness and counts", _answer("200", "alive", {
        "type": "object", "required": ["ok", "role"], "properties": {
            "ok": BOOL, "version": STR, "jobs": INT, "nodes": INT, "cycles": INT, "loop_lag_ms": NUM,
            "role": {"enum": ["leader", "standby"]}, "term": {"type": ["integer", "null"]},
            "leader": {"type": ["string", "null"]},
            "takeover": {"type": "object", "additionalProperties": NUM}, "warm_jobs": INT}}), public=True)},
    "/metrics": {"get": {"summary": "Prometheus metrics", "security": [],
                         "responses": {"200": {"description": "text exposition format",
                                               "content": {"text/plain": {"schema": STR}}}}}},
    PATH: {"get": _op("this description", _answer("200", "OpenAPI 3.1", {"type": "object"}), public=True)},
    "/api/v1/jobs": {
        "post": _op("submit a job (or an array)", _answer("201", "durable: its ids", _ref("Ids"),
                                                          _503="the state store refused the write"),
                    body=_ref("JobIn"), params=[IDEMPOTENCY]),
        "get": _op("active jobs, and ended ones of the last 5 minutes by state, a page at a time",
                   _answer("200", "one page of jobs; next_cursor continues it", _ref("JobPage")),
                   params=[_query("state", STR, "comma-separated states"), _query("user", STR, "only this user's"),
                           _query("project", STR, "only this project's"),
                           _query("all", {"enum": ["1", "true", "0", "false"]}, "every state"),
                           _query("limit", {"type": "integer", "minimum": 1, "maximum": 10_000},
                                  "at most this many jobs in the page (1000)"),
                           _query("cursor", STR, "the next_cursor of the page before"),
                           _query("fields", STR, "comma-separated job fields: each job carries only these")])},
    "/api/v1/jobs/batch": {"post": _op(
        "submit many jobs, all or none", _answer("201", "durable: their ids in order", _ref("Ids"),
                                                 _503="the state store refused the write"),
        body={"type": "object", "required": ["jobs"], "additionalProperties": False,
              "properties": {"jobs": {"type": "array", "items": _ref("JobIn"), "minItems": 1, "maxItems": 10_000}}},
        params=[IDEMPOTENCY])},
    "/api/v1/jobs/{id}": {"get": _op("a job with its events", _answer("200", "the job", _ref("Job")),
                                     params=[JOB_ID])},
    "/api/v1/jobs/{id}/why": {"get": _op("why a job waits", _answer("200", "blockers and what would help", {
        "type": "object", "required": ["id", "state", "reason", "blockers", "would_start"],
        "properties": {"id": STR, "state": STR, "reason": STR, "never": BOOL, "element": STR,
                       "array": {"type": "object"}, "start": {"type": "object"},
                       "blockers": {"type": "array", "items": {
                           "type": "object", "required": ["rule", "message"],
                           "properties": {"rule": STR, "message": STR}}},
                       "would_start": {"type": "array", "items": {
                           "type": "object", "required": ["condition", "who", "message"],
                           "properties": {"condition": STR, "who": STR, "message": STR}}},
                       "standing": {"type": "array", "items": {
                           "type": "object", "required": ["rule", "message"],
                           "properties": {"rule": STR, "message": STR}}},
                       "expected": {"type": "array", "items": {
                           "type": "object", "required": ["event", "message"],
                           "properties": {"event": STR, "at": NUM, "message": STR}}}}}),
        params=[JOB_ID])},
    "/api/v1/jobs/{id}/logs": {"get": {
        "summary": "a task's output file, from its node", "parameters": [
            JOB_ID, _query("stream", {"enum": ["out", "err"]}, "stdout or stderr"),
            _query("task", INT, "the task index"), _query("offset", INT, "from this byte"),
            _query("follow", {"enum": ["1", "true", "0", "false"]}, "stream while the job runs")],
        "responses": {"200": {"description": "the file's bytes", "content": {"text/plain": {"schema": STR}}},
                      "4XX": {"description": "refused", "content": _json(_ref("Error"))},
                      "503": {"description": "the node is not connected", "content": _json(_ref("Error"))},
                      "504": {"description": "the node did not answer", "content": _json(_ref("Error"))}}}},
    "/api/v1/jobs/{id}/cancel": _change("cancel"),
    "/api/v1/jobs/{id}/hold": _change("hold"),
    "/api/v1/jobs/{id}/release": _change("release"),
    "/api/v1/jobs/{id}/requeue": _change("requeue"),
    "/api/v1/jobs/{id}/checkpoints": {"post": _op(
        "record that a running job (or a victim within its grace) has a complete checkpoint now; the job's own "
        "GPUD_CHECKPOINT_TOKEN may call this and nothing else",
        _answer("201", "recorded", {
            "type": "object", "required": ["job", "at", "checkpoints", "stopped_now"],
            "properties": {"job": STR, "at": NUM, "checkpoints": INT, "stopped_now": BOOL}}),
        params=[JOB_ID])},
    "/api/v1/history": {"get": _op("ended jobs, newest first", _answer("200", "jobs", _ref("Jobs")), params=[
        _query("since", NUM, "ended at or after this Unix time"), _query("user", STR, "only this user's"),
        _query("project", STR, "only this project's"),
        _query("limit", {"type": "integer", "minimum": 1, "maximum": 10_000}, "at most this many (100)")])},
    "/api/v1/nodes": {"get": _op("the nodes", _answer("200", "nodes", {
        "type": "object", "required": ["nodes"], "properties": {"nodes": {"type": "array", "items": _ref("Node")}}}))},
    "/api/v1/nodes/{name}/drain": {"post": _op("admin: no new work on a node", _answer("200", "the node", _ref("Node")),
                                               params=[_path("name", "the node")], body={
        "type": "object", "required": ["reason"], "properties": {"reason": {"type": "string", "minLength": 1}}})},
    "/api/v1/nodes/{name}/resume": {"post": _op("admin: a drained node takes work again",
                                                _answer("200", "the node", _ref("Node")),
                                                params=[_path("name", "the node")])},
    "/api/v1/projects": {"get": _op("each queue's quota, fair share and use", _answer("200", "queues", {
        "type": "object", "required": ["queues"],
        "properties": {"queues": {"type": "array", "items": _ref("Queue")}}}))},
    "/api/v1/usage": {"get": _op("decayed usage and standing of each department, project and user (as sshare)",
                                 _answer("200", "rows", {
        "type": "object", "required": ["rows", "half_life_s", "reset", "charged_at"],
        "properties": {"rows": {"type": "array", "items": {
            "type": "object", "required": ["level", "pool", "name", "gpu_hours", "cpu_hours", "memory_gib_hours",
                                           "entitlement_share", "usage_share", "standing"],
            "properties": {"level": {"enum": ["department", "project", "user"]}, "pool": STR, "name": STR,
                           "department": STR, "project": _nullable(STR), "user": _nullable(STR),
                           "quota": _nullable(NUM), "fair_share": _nullable(NUM), "gpu_hours": NUM,
                           "cpu_hours": NUM, "memory_gib_hours": NUM, "entitlement_share": NUM,
                           "usage_share": NUM, "standing": _nullable(NUM)}}},
                       "half_life_s": NUM, "reset": STR, "charged_at": NUM}}),
        params=[_query("pool", STR, "only this node pool"), _query("project", STR, "only this project"),
                _query("user", STR, "only this user")])},
    "/api/v1/report": {"get": _op("GPU-hours, CPU-hours, jobs, waits and GPU efficiency by group (as sreport)",
                                  _answer("200", "rows", {
        "type": "object", "required": ["by", "since", "until", "rows"],
        "properties": {"by": STR, "since": NUM, "until": _nullable(NUM), "rows": {"type": "array", "items": {
            "type": "object", "required": ["gpu_hours", "cpu_hours", "jobs", "mean_wait_s", "p95_wait_s",
                                           "gpu_utilization", "gpu_memory_peak_gib"],
            "properties": {"gpu_hours": NUM, "cpu_hours": NUM, "jobs": INT, "mean_wait_s": _nullable(NUM),
                           "p95_wait_s": _nullable(NUM), "gpu_utilization": _nullable(NUM),
                           "gpu_memory_peak_gib": _nullable(NUM)}}}}}),
        params=[_query("by", {"enum": ["user", "project", "department", "node"]}, "how to group (user)"),
                _query("since", NUM, "jobs that ended at or after this Unix time (30 days ago)"),
                _query("until", NUM, "and before this one (no end: running jobs count too)"),
                _query("user", STR, "only this user's jobs"), _query("project", STR, "only this project's")])},
    "/api/v1/policy/reload": {"post": _op("admin: read the policy file again", _answer("200", "in use", {
        "type": "object", "required": ["ok"], "properties": {"ok": BOOL, "projects": INT, "departments": INT}}))},
    "/api/v1/tokens": {"post": _op("admin: a new token for a user", _answer("201", "the token, shown once", {
        "type": "object", "required": ["user", "admin", "token"], "properties": {"user": STR, "admin": BOOL,
                                                                                 "allow_root": BOOL, "token": STR,
                                                                                 "id": STR}}),
        body={"type": "object", "required": ["user"], "additionalProperties": False,
              "properties": {"user": {"type": "string", "minLength": 1}, "admin": BOOL, "allow_root": BOOL}}),
        "get": _op("admin: the tokens in use, never the tokens themselves", _answer("200", "tokens", {
            "type": "object", "required": ["tokens"],
            "properties": {"tokens": {"type": "array", "items": _ref("Token")}}}))},
    "/api/v1/tokens/revoke": {"post": _op("admin: revoke a token by id, or every token of a user",
                                          _answer("200", "the tokens revoked", {
                                              "type": "object", "required": ["revoked"],
                                              "properties": {"revoked": {"type": "array", "items": _ref("Token")}}}),
                                          body={"type": "object", "minProperties": 1, "maxProperties": 1,
                                                "additionalProperties": False,
                                                "properties": {"id": STR, "user": STR}})},
    "/api/v1/jobs/{id}/attach": _session("the interactive job's main terminal (a WebSocket)", TERMINAL),
    "/api/v1/jobs/{id}/exec": _session("a new terminal in a running job's task (a WebSocket)", [
        _query("argv", STRINGS, "the command, one argument each (the login shell without it)"), TASK, *TERMINAL]),
    "/api/v1/jobs/{id}/forward": _session("one TCP connection to a port on the job's node (a WebSocket)", [
        _query("port", {"type": "integer", "minimum": 1, "maximum": 65535}, "the port on the node"), TASK]),
    "/api/v1/whoami": {"get": _op("whose token this is", _answer("200", "the token's user", {
        "type": "object", "required": ["user", "admin"], "properties": {"user": STR, "admin": BOOL}}))},
    "/api/v1/state": {"get": _op("admin: the live state as a scenario", _answer("200", "policy, nodes, jobs", {
        "type": "object", "required": ["nodes", "jobs"]}))},
}


def document() -> dict[str, Any]:
    """The OpenAPI 3.1 document of the controller's API."""
    return {
        "openapi": "3.1.0",
        "info": {"title": "gpud controller API", "version": __version__,
                 "description": "See docs/api.md. Every error is JSON: {\"error\": \"...\"}."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
                       "schemas": SCHEMAS},
        "paths": PATHS,
    }

