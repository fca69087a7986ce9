"""The HTTP client against a stand-in server on 127.0.0.1: requests, answers, errors and exit codes."""

import socket

import pytest

from gpud.client import (EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, ApiError, Client, ConfigFileError,
                         Unreachable, job_path, load_settings)
from gpuctl_helpers import closed_port, stand_in  # noqa: F401  (a fixture)


def test_get_sends_the_token_and_the_query(stand_in):
    stand_in.routes["GET /api/v1/jobs"] = (200, {"jobs": []}, {})
    answer = Client(stand_in.url, "s3cret").get("jobs", {"state": "PENDING", "all": True, "user": None,
                                                          "me": False})
    assert answer == {"jobs": []}
    request = stand_in.requests[0]
    assert request["headers"]["Authorization"] == "Bearer s3cret"
    assert request["query"] == "state=PENDING&all=1"


def test_post_sends_json(stand_in):
    stand_in.routes["POST /api/v1/jobs"] = (201, {"ids": ["1"]}, {})
    assert Client(stand_in.url).post("jobs", {"project": "p", "command": ["true"]}) == {"ids": ["1"]}
    assert stand_in.requests[0]["body"] == {"project": "p", "command": ["true"]}
    assert "Authorization" not in stand_in.requests[0]["headers"]


@pytest.mark.parametrize("status, exit_code", [(401, EXIT_REFUSED), (403, EXIT_REFUSED), (404, EXIT_REFUSED),
                                               (422, EXIT_REFUSED), (500, EXIT_UNREACHABLE),
                                               (503, EXIT_UNREACHABLE)])
def test_error_answers_become_one_line_and_an_exit_code(stand_in, status, exit_code):
    stand_in.routes["POST /api/v1/jobs"] = (status, {"error": "unknown project 'x'", "field": "project"}, {})
    with pytest.raises(ApiError) as caught:
        Client(stand_in.url).post("jobs", {})
    assert caught.value.exit_code == exit_code
    assert caught.value.status == status
    assert "\n" not in str(caught.value)
    if status < 500:
        assert str(caught.value).startswith("unknown project 'x' (HTTP")
        assert "field 'project'" in str(caught.value)
    else:
        assert str(caught.value) == f"the controller failed: unknown project 'x' (HTTP {status})"


def test_401_says_how_to_give_a_token(stand_in):
    stand_in.routes["GET /api/v1/whoami"] = (401, {"error": "missing token"}, {})
    with pytest.raises(ApiError, match="set GPUD_TOKEN"):
        Client(stand_in.url).get("whoami")


def test_an_error_that_is_not_json_still_reads(stand_in):
    stand_in.routes["GET /api/v1/nodes"] = (502, b"<html>Bad Gateway</html>\n", {"Content-Type": "text/html"})
    with pytest.raises(ApiError, match="Bad Gateway"):
        Client(stand_in.url).get("nodes")


def test_an_answer_that_is_not_json_is_a_server_failure(stand_in):
    stand_in.routes["GET /api/v1/nodes"] = (200, b"hello", {})
    with pytest.raises(ApiError) as caught:
        Client(stand_in.url).get("nodes")
    assert caught.value.exit_code == EXIT_UNREACHABLE


def test_chunked_streams_are_read_as_they_come(stand_in):
    def chunked(handler):
        handler.send_response(200)
        handler.send_header("Content-Type", "text/plain")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for piece in (b"line 1\n", b"line 2\n"):
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
        handler.wfile.write(b"0\r\n\r\n")
    stand_in.routes["GET /api/v1/jobs/42/logs"] = (200, chunked, {})
    chunks = list(Client(stand_in.url).stream(job_path("42", "logs"), {"follow": True}))
    assert b"".join(chunks) == b"line 1\nline 2\n"
    assert stand_in.requests[0]["query"] == "follow=1"


def test_job_ids_are_escaped_in_paths():
    assert job_path("42_7", "why") == "jobs/42_7/why"
    assert job_path("../nodes") == "jobs/..%2Fnodes"


def test_closed_port_is_unreachable():
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(Unreachable) as caught:
        Client(url).get("whoami")
    assert str(caught.value) == f"cannot reach the controller at {url} (connection refused); is it running? " \
                                f"set GPUD_URL"
    assert caught.value.exit_code == EXIT_UNREACHABLE


def test_a_silent_server_times_out():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        with pytest.raises(Unreachable, match="no answer in time"):
            Client(url, timeout=0.2, retry_s=1.0).get("whoami")  # not the default minute of retries


def test_settings_from_the_environment_win(tmp_path):
    config = tmp_path / "gpud" / "client.toml"
    config.parent.mkdir()
    config.write_text('url = "http://10.0.0.1:6830"\ntoken = "from-file"\n')
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert load_settings(env) == ("http://10.0.0.1:6830", "from-file")
    assert load_settings({**env, "GPUD_URL": "http://h:1/", "GPUD_TOKEN": "t"}) == ("http://h:1", "t")


def test_settings_token_file(tmp_path):
    (tmp_path / "admin.token").write_text("  tok123\n")
    config = tmp_path / "gpud" / "client.toml"
    config.parent.mkdir()
    config.write_text(f'token_file = "{tmp_path / "admin.token"}"\n')
    assert load_settings({"XDG_CONFIG_HOME": str(tmp_path)}) == ("http://127.0.0.1:6830", "tok123")
    config.write_text(f'token_file = "{tmp_path / "missing"}"\n')
    with pytest.raises(ConfigFileError, match="missing"):
        load_settings({"XDG_CONFIG_HOME": str(tmp_path)})


def test_settings_defaults_and_a_broken_file(tmp_path):
    assert load_settings({"XDG_CONFIG_HOME": str(tmp_path)}) == ("http://127.0.0.1:6830", None)
    config = tmp_path / "gpud" / "client.toml"
    config.parent.mkdir()
    config.write_text("url = \n")
    with pytest.raises(ConfigFileError) as caught:
        load_settings({"XDG_CONFIG_HOME": str(tmp_path)})
    assert caught.value.exit_code == EXIT_USAGE
    assert str(config) in str(caught.value)


def test_timeout_from_the_environment(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path)}
    assert Client.from_environment(env).timeout == 30
    assert Client.from_environment({**env, "GPUD_TIMEOUT": "2.5"}).timeout == 2.5
    for bad in ("0", "soon", "nan"):
        with pytest.raises(ConfigFileError, match="GPUD_TIMEOUT"):
            Client.from_environment({**env, "GPUD_TIMEOUT": bad})


def test_a_bad_url_is_a_usage_error():
    with pytest.raises(ConfigFileError, match="bad controller URL"):
        Client("ftp://x")
