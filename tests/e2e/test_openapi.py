"""The API description: it names exactly the routes the controller serves, and a fuzzer finds every answer matches it.

schemathesis generates requests from /api/v1/openapi.json (valid and
invalid ones) and sends them to a real controller on 127.0.0.1 as an admin
and as two users; no answer may be a server error, and every answer must
match the description (status, content type, body schema).
"""

from __future__ import annotations

import re

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation import GenerationMode
from schemathesis.specs.openapi.checks import (content_type_conformance, response_schema_conformance,
                                               status_code_conformance)
from schemathesis.checks import not_a_server_error

from daemons import running_cluster
from gpud.controller import openapi
from gpud.controller.app import make_app
from gpud.controller.config import ControllerConfig
from gpud.submission import JOB_FIELDS
from hypothesis_budget import examples

# Not negative_data_rejection: like most REST APIs this one ignores query parameters it does not know.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = examples(25)  # requests per operation and caller


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("openapi")) as cluster:
        cluster.tokens = {"admin": cluster.admin_token, "alice": cluster.token_for("alice"),
                          "bob": cluster.token_for("bob")}
        cluster.held = cluster.submit(command=["true"], hold=True, token=cluster.tokens["alice"])
        yield cluster


OPERATIONS = [(method, path) for path, ops in openapi.document()["paths"].items() for method in ops]
MODES = (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
SENT = [0]


@pytest.mark.parametrize("method, path", OPERATIONS, ids=[f"{m.upper()} {p}" for m, p in OPERATIONS])
def test_every_answer_matches_the_description_and_none_is_a_server_error(live, method, path):
    """Each request is sent as alice, as bob and as the admin; schemathesis checks every answer."""
    schema = schemathesis.openapi.from_dict(openapi.document())
    operation = schema.find_operation_by_path(method, path)
    spec = openapi.document()["paths"][path][method]
    for mode in MODES if spec.get("parameters") or spec.get("requestBody") else MODES[:1]:
        @given(case=operation.as_strategy(generation_mode=mode))
        @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def exchange(case):
            SENT[0] += 3
            for who in ("alice", "bob", "admin"):
                case.call_and_validate(base_url=live.url, headers={"Authorization": f"Bearer {live.tokens[who]}"},
                                       checks=CHECKS, timeout=30)
        exchange()


def test_the_description_names_every_route_the_controller_serves(tmp_path):
    policy = tmp_path / "policy.toml"
    policy.write_text('[[projects]]\nname = "a"\ngpu_quota = 1\n')
    app = make_app(ControllerConfig(state_dir=str(tmp_path / "state"), policy=str(policy), init=True))
    served = set()
    for route in app.router.routes():
        if route.method == "HEAD":
            continue
        info = route.resource.get_info()
        path = info.get("formatter") or info.get("path")
        choices = re.search(r"\(\?P<verb>([\w|]+)\)", info["pattern"].pattern) if "pattern" in info else None
        for verb in (choices.group(1).split("|") if choices else [None]):
            served.add((route.method.lower(), path.replace("{verb}", verb) if verb else path))
    described = {(method, path) for path, ops in openapi.document()["paths"].items() for method in ops}
    served -= {("get", p) for p in openapi.UNDESCRIBED}
    assert not served - described, f"describe these routes in gpud/controller/openapi.py: {served - described}"
    assert not described - served, f"these described routes are not served: {described - served}"


def test_the_job_schema_takes_exactly_the_fields_the_submit_reader_knows():
    assert set(openapi.SCHEMAS["JobIn"]["properties"]) == JOB_FIELDS


def test_the_description_is_served_without_credentials(live):
    status, body = live.api("GET", openapi.PATH, token=None)
    assert status == 200 and body["openapi"].startswith("3.1")


def test_the_fuzzer_sent_requests(live):
    """Runs after the fuzzing above (in file order): it must have sent something, and the controller lives."""
    print(f"schemathesis sent {SENT[0]} requests")
    assert live.controller.alive() and SENT[0] > 0
