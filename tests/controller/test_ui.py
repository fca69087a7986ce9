"""The web dashboard in process: sign-in, sessions, CSRF, escaping, security headers and who sees what.

A real controller (fresh SQLite state, the API on a test server) and its
dashboard on another, driven over HTTP with separate cookie jars per user.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from gpud.controller.config import load_config
from gpud.errors import ConfigError
from gpud.ui.session import LOGIN_COOKIE, SESSION_COOKIE, Signer
import aiohttp
from aiohttp.test_utils import TestServer

from gpud.controller.app import make_app
from gpud.controller.keys import CONTROLLER
from gpud.ui.server import UI_SERVER
from ui_helpers import close_dashboard, config_for, csrf_of, open_dashboard, sign_in, until

SECRET_ENV = {"WANDB_API_KEY": "sekrit-value-123"}
PAGES = ("/ui/", "/ui/queue", "/ui/projects", "/ui/nodes", "/ui/usage")


@pytest.fixture
async def board(tmp_path):
    dashboard = await open_dashboard(tmp_path)
    try:
        yield dashboard
    finally:
        await close_dashboard(dashboard)


async def test_a_visitor_without_a_session_is_sent_to_sign_in(board):
    browser = await board.browser()
    for path in (*PAGES, "/ui/jobs/1", "/ui/admin/tokens"):
        answer = await browser.get(path, allow_redirects=False)
        assert answer.status == 303, path
        assert answer.headers["Location"].startswith("/ui/login?next="), answer.headers["Location"]
    answer = await browser.get("/ui/queue", headers={"HX-Request": "true"}, allow_redirects=False)
    assert answer.status == 401 and answer.headers["HX-Redirect"] == "/ui/login"
    answer = await browser.get("/", allow_redirects=False)
    assert answer.status == 302 and answer.headers["Location"] == "/ui/"


async def test_sign_in_sets_a_signed_strict_http_only_cookie_with_an_expiry(board):
    browser = await board.browser()
    answer = await sign_in(browser, board.tokens["alice"])
    assert answer.status == 303 and answer.headers["Location"] == "/ui/queue"
    cookie = answer.cookies[SESSION_COOKIE]
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/ui/"
    assert int(cookie["max-age"]) > 0
    assert not cookie["secure"]  # plain HTTP here; over TLS the cookie is Secure
    assert board.tokens["alice"] not in cookie.value  # the cookie names the token by its hash only
    page = await (await browser.get("/ui/queue")).text()
    assert "alice" in page and "Sign out" in page


async def test_a_wrong_token_or_a_missing_csrf_token_does_not_sign_in(board):
    browser = await board.browser()
    answer = await sign_in(browser, "gpud_not-a-token")
    assert answer.status == 401 and "unknown or revoked token" in await answer.text()
    assert SESSION_COOKIE not in answer.cookies
    answer = await browser.post("/ui/login", data={"token": board.tokens["alice"]}, allow_redirects=False)
    assert answer.status == 403 and SESSION_COOKIE not in answer.cookies
    assert (await browser.get("/ui/queue", allow_redirects=False)).status == 303


async def test_after_sign_in_only_a_path_of_the_dashboard_is_followed(board):
    for target in ("//evil.example/", "https://evil.example/ui/", "/ui//evil.example"):
        browser = await board.browser()
        page = await (await browser.get("/ui/login")).text()
        answer = await browser.post("/ui/login", data={"token": board.tokens["alice"], "csrf": csrf_of(page),
                                                       "next": target}, allow_redirects=False)
        assert answer.status == 303 and answer.headers["Location"] == "/ui/", target


async def test_forged_expired_and_revoked_sessions_are_refused(board, tmp_path):
    browser = await board.browser("alice")
    assert (await browser.get("/ui/queue", allow_redirects=False)).status == 200
    value = next(c for c in browser.cookie_jar if c.key == SESSION_COOKIE).value
    signer = Signer.from_state_dir(str(tmp_path / "state"))
    forged = value.replace(value.split(":")[0], "0" * 64)  # another token's hash, the old signature
    alice_hash = value.split(":")[0]
    expired, _ = signer.new_session(alice_hash, time.time() - 100, lifetime_s=10)
    for cookie in (forged, expired, "garbage", value[:-3] + "abc"):
        other = await board.browser()
        other.cookie_jar.update_cookies({SESSION_COOKIE: cookie}, board.ui.make_url("/ui/"))
        assert (await other.get("/ui/queue", allow_redirects=False)).status == 303, cookie
    status, body = await board.call("POST", "/api/v1/tokens/revoke", body={"user": "alice"})
    assert status == 200, body
    assert (await browser.get("/ui/queue", allow_redirects=False)).status == 303


async def test_sign_out_needs_the_csrf_token_and_ends_the_session(board):
    browser = await board.browser("alice")
    assert (await browser.post("/ui/logout", data={}, allow_redirects=False)).status == 403
    page = await (await browser.get("/ui/queue")).text()
    answer = await browser.post("/ui/logout", data={"csrf": csrf_of(page)}, allow_redirects=False)
    assert answer.status == 303 and answer.headers["Location"] == "/ui/login"
    assert (await browser.get("/ui/queue", allow_redirects=False)).status == 303


async def test_a_job_is_cancelled_only_with_the_csrf_token_of_its_owners_session(board):
    job = await board.submit("alice")
    alice = await board.browser("alice")
    page = await (await alice.get(f"/ui/jobs/{job}")).text()
    assert 'id="cancel-button"' in page
    for data in ({}, {"csrf": "wrong"}):
        answer = await alice.post(f"/ui/jobs/{job}/cancel", data=data, allow_redirects=False)
        assert answer.status == 403
    status, shown = await board.call("GET", f"/api/v1/jobs/{job}")
    assert shown["state"] == "PENDING"
    bob = await board.browser("bob")
    bob_page = await (await bob.get(f"/ui/jobs/{job}")).text()
    assert 'id="cancel-button"' not in bob_page
    answer = await bob.post(f"/ui/jobs/{job}/cancel", data={"csrf": csrf_of(bob_page)}, allow_redirects=False)
    assert answer.status == 403 and "belongs to alice" in await answer.text()
    assert (await board.call("GET", f"/api/v1/jobs/{job}"))[1]["state"] == "PENDING"
    answer = await alice.post(f"/ui/jobs/{job}/cancel", data={"csrf": csrf_of(page)}, allow_redirects=False)
    assert answer.status == 303 and answer.headers["Location"] == f"/ui/jobs/{job}"
    assert (await board.call("GET", f"/api/v1/jobs/{job}"))[1]["state"] == "CANCELLED"


async def test_hold_and_release_from_the_job_page(board):
    job = await board.submit("alice", gpus=64)  # never fits: it stays pending
    alice = await board.browser("alice")
    page = await (await alice.get(f"/ui/jobs/{job}")).text()
    assert (await alice.post(f"/ui/jobs/{job}/hold", data={"csrf": csrf_of(page)})).status == 200
    assert (await board.call("GET", f"/api/v1/jobs/{job}"))[1]["hold"] is True
    page = await (await alice.get(f"/ui/jobs/{job}")).text()
    assert 'id="release-button"' in page and 'id="hold-button"' not in page
    assert (await alice.post(f"/ui/jobs/{job}/release", data={"csrf": csrf_of(page)})).status == 200
    assert (await board.call("GET", f"/api/v1/jobs/{job}"))[1]["hold"] is False


async def test_names_and_text_are_escaped_everywhere(board):
    evil = '<script>alert("x")</script>'
    job = await board.submit("alice", name=evil, env={"NOTE": evil})
    alice = await board.browser("alice")
    for path in ("/ui/queue", f"/ui/jobs/{job}"):
        page = await (await alice.get(path)).text()
        assert "&lt;script&gt;alert(" in page, path
        assert "<script>alert" not in page, path


async def test_every_page_sends_the_content_security_policy_and_refuses_framing(board):
    await board.submit("alice")
    alice = await board.browser("alice")
    for path in (*PAGES, "/ui/jobs/1", "/ui/login", "/ui/usage.csv", "/ui/static/ui.js"):
        answer = await alice.get(path)
        assert answer.status == 200, path
        csp = answer.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp, path
        assert answer.headers["X-Frame-Options"] == "DENY" and answer.headers["X-Content-Type-Options"] == "nosniff"
        text = await answer.text()
        # No inline script: every <script> element loads a file of the dashboard's own.
        assert "<script>" not in text.replace("&lt;script&gt;", ""), path


async def test_another_users_job_shows_no_command_environment_or_paths(board):
    job = await board.submit("alice", env=SECRET_ENV, command=["python3", "train-secret.py"])
    alice, bob = await board.browser("alice"), await board.browser("bob")
    mine = await (await alice.get(f"/ui/jobs/{job}")).text()
    assert "sekrit-value-123" in mine and "train-secret.py" in mine and str(board.root) in mine
    for path in (f"/ui/jobs/{job}", "/ui/queue", "/ui/", f"/ui/queue?user=alice"):
        theirs = await (await bob.get(path)).text()
        assert "sekrit-value-123" not in theirs and "WANDB_API_KEY" not in theirs, path
        assert "train-secret.py" not in theirs and str(board.root) not in theirs, path
    assert "only alice and the admins see" in await (await bob.get(f"/ui/jobs/{job}")).text()
    answer = await bob.get(f"/ui/jobs/{job}/log")
    assert answer.status == 403


async def test_admin_pages_and_node_changes_are_for_admins_only(board):
    bob, admin = await board.browser("bob"), await board.browser("admin")
    assert (await bob.get("/ui/admin/tokens")).status == 403
    page = await (await bob.get("/ui/nodes")).text()
    assert "Tokens</a>" not in page
    answer = await bob.post("/ui/nodes/n1/drain", data={"csrf": csrf_of(page), "reason": "x"})
    assert answer.status == 403
    tokens = await (await admin.get("/ui/admin/tokens")).text()
    assert "alice" in tokens and "bob" in tokens and board.tokens["bob"] not in tokens


async def test_an_admin_drains_and_resumes_a_node_and_the_overview_shows_its_gpus(board):
    await board.add_node("n1", gpus=2)
    # The admin's job runs as the user running the tests (who exists here), so it keeps running.
    job = await board.submit("admin", gpus=1, cpus=1, memory_gib=1)
    await until(lambda: board.api.app[CONTROLLER].cluster.jobs[job].state == "RUNNING", f"job {job} to run")
    admin = await board.browser("admin")
    overview = await (await admin.get("/ui/")).text()
    assert overview.count('<li class="gpu allocated"') == 1 and overview.count('<li class="gpu idle"') == 1
    assert f'href="/ui/jobs/{job}"' in overview
    page = await (await admin.get("/ui/nodes")).text()
    answer = await admin.post("/ui/nodes/n1/drain", data={"csrf": csrf_of(page), "reason": ""})
    assert answer.status == 422 and "say why" in await answer.text()
    answer = await admin.post("/ui/nodes/n1/drain", data={"csrf": csrf_of(page), "reason": "<b>fan</b> noise"})
    assert answer.status == 200 and "&lt;b&gt;fan&lt;/b&gt; noise" in await answer.text()
    status, nodes = await board.call("GET", "/api/v1/nodes")
    assert nodes["nodes"][0]["state"] == "draining" and nodes["nodes"][0]["reason"] == "<b>fan</b> noise"
    page = await (await admin.get("/ui/nodes")).text()
    assert "Resume</button>" in page
    assert (await admin.post("/ui/nodes/n1/resume", data={"csrf": csrf_of(page)})).status == 200
    assert (await board.call("GET", "/api/v1/nodes"))[1]["nodes"][0]["state"] == "up"
    projects = await (await admin.get("/ui/projects")).text()
    assert projects.index("research") < projects.index(">alpha<") < projects.index(">beta<")


async def test_the_queue_is_paged_filtered_and_shows_an_array_as_one_row(board):
    status, body = await board.call("POST", "/api/v1/jobs/batch", "alice",
                                    {"jobs": [{"project": "alpha", "workdir": str(board.root), "name": f"j{i}",
                                               "command": ["true"], "gpus": 64} for i in range(120)]})
    assert status == 201, body
    await board.submit("bob", project="beta", gpus=64, array="0-9", name="sweep")
    alice = await board.browser("alice")
    first = await (await alice.get("/ui/queue")).text()
    assert "130 jobs in 121 rows, page 1 of 3" in first and first.count('<tr class="pending" id="row-') == 50
    last = await (await alice.get("/ui/queue?page=3")).text()
    assert last.count('<tr class="pending" id="row-') == 21 and "Array " in last and "10 elements" in last
    bobs = await (await alice.get("/ui/queue?user=bob")).text()
    assert "10 jobs in 1 row" in bobs and '<td class="name">sweep</td>' in bobs
    assert '<td class="name">j7</td>' in first and '<td class="name">j7</td>' not in bobs
    beta = await (await alice.get("/ui/queue?project=beta&state=RUNNING")).text()
    assert "No jobs match these filters" in beta
    answer = await alice.get("/ui/queue?state=bogus")
    assert answer.status == 422 and "state is one of" in await answer.text()


async def test_a_live_region_reloads_as_a_fragment(board):
    await board.submit("alice", name="fragment-job")
    alice = await board.browser("alice")
    fragment = await (await alice.get("/ui/queue", headers={"HX-Request": "true"})).text()
    assert "fragment-job" in fragment and "<html" not in fragment


async def test_the_event_stream_nudges_open_pages_when_a_job_is_submitted(board):
    alice = await board.browser("alice")
    async with alice.get("/ui/events") as stream:
        assert stream.headers["Content-Type"] == "text/event-stream"
        assert (await stream.content.readline()).startswith(b"retry:")
        await stream.content.readline()
        await board.submit("alice")
        line = await stream.content.readline()
        assert line == b"event: change\n"


async def next_event(stream: aiohttp.ClientResponse) -> tuple[str, str]:
    """The next event on a server-sent event stream (keepalive comments skipped): its kind and its data."""
    kind, data = "message", []
    while True:
        line = (await asyncio.wait_for(stream.content.readline(), 60)).decode()
        if not line:
            raise AssertionError("the stream ended")
        line = line.rstrip("\n")
        if line.startswith("event: "):
            kind = line[len("event: "):]
        elif line.startswith("data: "):
            data.append(line[len("data: "):])
        elif line == "" and (data or kind != "message"):
            return kind, "\n".join(data)


async def open_stream(browser: aiohttp.ClientSession, view: str) -> aiohttp.ClientResponse:
    """The event stream for the page ``view``, past its opening ``retry``."""
    stream = await browser.get("/ui/events", params={"view": view})
    assert stream.status == 200 and stream.headers["Content-Type"] == "text/event-stream"
    assert (await stream.content.readline()).startswith(b"retry:")
    await stream.content.readline()
    return stream


async def test_the_event_stream_pushes_each_users_own_view_of_the_page(board):
    job = await board.submit("alice", env=SECRET_ENV, name="pushed-job")
    alice, bob = await board.browser("alice"), await board.browser("bob")
    streams = [await open_stream(alice, f"/ui/jobs/{job}"), await open_stream(alice, f"/ui/jobs/{job}"),
               await open_stream(bob, f"/ui/jobs/{job}"), await open_stream(alice, "/ui/queue?state=PENDING")]
    try:
        await board.submit("bob", name="second-job")
        (k1, mine), (k2, again), (k3, theirs), (k4, queue) = [await next_event(s) for s in streams]
        assert k1 == k2 == k3 == k4 == "section"
        assert "sekrit-value-123" in mine and "<html" not in mine and again == mine
        assert "sekrit-value-123" not in theirs and "WANDB_API_KEY" not in theirs and "pushed-job" in theirs
        assert "second-job" in queue and "pushed-job" in queue and "<html" not in queue
        # each session's forms carry its own CSRF token, never another's
        page = await (await alice.get(f"/ui/jobs/{job}")).text()
        assert csrf_of(page) in mine
        assert (await alice.get(f"/ui/jobs/{job}", headers={"HX-Request": "true"})).status == 200
    finally:
        for stream in streams:
            stream.close()


async def test_a_stream_escapes_what_it_pushes_and_nudges_a_page_it_cannot_show(board):
    alice = await board.browser("alice")
    escaped, gone = await open_stream(alice, "/ui/queue"), await open_stream(alice, "/ui/jobs/999")
    try:
        await board.submit("alice", name="<script>alert(1)</script>")
        kind, text = await next_event(escaped)
        assert kind == "section" and "<script>" not in text and "&lt;script&gt;" in text
        assert await next_event(gone) == ("change", "")
    finally:
        escaped.close()
        gone.close()


async def test_a_part_that_did_not_change_is_not_sent_again(board):
    ended = await board.submit("alice", name="ended-job")
    status, body = await board.call("POST", f"/api/v1/jobs/{ended}/cancel", "alice")
    assert status == 200, body
    alice = await board.browser("alice")
    job, queue = await open_stream(alice, f"/ui/jobs/{ended}"), await open_stream(alice, "/ui/queue")
    try:
        await board.submit("alice", name="first-change")
        (k1, shown), (k2, listed) = await next_event(job), await next_event(queue)
        assert k1 == k2 == "section" and "ended-job" in shown and "first-change" in listed
        await board.submit("alice", name="second-change")
        kind, listed = await next_event(queue)
        assert kind == "section" and "second-change" in listed
        # the ended job's page was pushed in the same pass, had it changed: its stream stays quiet
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(job.content.readline(), 1.0)
    finally:
        job.close()
        queue.close()


async def test_a_revoked_session_gets_no_more_of_the_page(board):
    alice = await board.browser("alice")
    stream = await open_stream(alice, "/ui/queue")
    try:
        status, body = await board.call("POST", "/api/v1/tokens/revoke", body={"user": "alice"})
        assert status == 200, body
        await board.submit("bob", name="after-revoke")
        assert await next_event(stream) == ("change", "")
        assert await asyncio.wait_for(stream.content.read(), 60) == b""  # and the stream ends
    finally:
        stream.close()


async def test_usage_downloads_as_csv_with_only_ones_own_jobs_unless_admin(board):
    alice = await board.browser("alice")
    answer = await alice.get("/ui/usage.csv?by=user&window=day")
    assert answer.status == 200 and answer.content_type == "text/csv"
    assert "attachment" in answer.headers["Content-Disposition"]
    assert (await answer.text()).splitlines()[0].startswith("user,gpu_hours,cpu_hours,jobs")
    assert (await alice.get("/ui/usage?by=nobody")).status == 422


async def test_behind_a_tls_proxy_the_cookie_can_be_marked_secure(tmp_path):
    board = await open_dashboard(tmp_path, ui_secure_cookie=True)
    try:
        browser = await board.browser()
        form = await browser.get("/ui/login")
        nonce = form.cookies[LOGIN_COOKIE]
        assert nonce["secure"]
        # A browser sends the Secure cookie back over the proxy's TLS; over this test's plain HTTP, by hand.
        answer = await browser.post("/ui/login", data={"token": board.tokens["alice"], "csrf": csrf_of(await form.text())},
                                    headers={"Cookie": f"{LOGIN_COOKIE}={nonce.value}"}, allow_redirects=False)
        assert answer.status == 303 and answer.cookies[SESSION_COOKIE]["secure"]
    finally:
        await close_dashboard(board)


@pytest.mark.parametrize("enabled", [True, False])
async def test_the_controller_serves_the_dashboard_on_its_own_port_unless_turned_off(tmp_path, enabled):
    app = make_app(config_for(tmp_path, ui=enabled, ui_port=0))
    server = TestServer(app)
    await server.start_server()
    try:
        url = app[UI_SERVER].url
        if not enabled:
            assert url == ""
            return
        assert url.endswith("/ui/") and f":{server.port}/" not in url
        async with aiohttp.ClientSession() as browser:
            answer = await browser.get(url, allow_redirects=False)
            assert answer.status == 303 and answer.headers["Location"] == "/ui/login?next=/ui/"
    finally:
        await server.close()


def test_the_dashboard_is_configured_in_controller_toml(tmp_path):
    path = tmp_path / "controller.toml"
    path.write_text('listen = "127.0.0.1:7000"\n')
    assert load_config(str(path)).ui_address == ("127.0.0.1", 7002)
    path.write_text('listen = "127.0.0.1:7000"\n[ui]\nlisten = "0.0.0.0:8080"\n')
    config = load_config(str(path))
    assert config.ui and config.ui_address == ("0.0.0.0", 8080)
    path.write_text("[ui]\nenabled = false\nsecure_cookie = true\n")
    assert not load_config(str(path)).ui and load_config(str(path)).ui_secure_cookie
    path.write_text('[ui]\nlisten = "nowhere"\n')
    with pytest.raises(ConfigError, match="ui.listen"):
        load_config(str(path))
