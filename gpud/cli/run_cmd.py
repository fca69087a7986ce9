"""``gpuctl run``, ``attach``, ``forward`` and ``notebook``: interactive work on an allocation, through the controller."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import time

from gpud.cli.common import EXIT_REFUSED, EXIT_UNREACHABLE, EXIT_USAGE, UsageError, client
from gpud.cli.parsing import add_verb
from gpud.cli.submit_cmd import add_options, build_job

WAIT_POLL_S = 1.0
NON_PREEMPTIBLE = 100  # priorities from here up are never preempted, and run only within quota
# Below Linux's ephemeral range (32768-60999), where the node's own outgoing connections would take ports.
NOTEBOOK_PORTS = (20000, 32768)

RUN_DESCRIPTION = """\
Run a shell or a command interactively on GPUs, as `srun --pty` does: submit an
interactive job (unless --priority says otherwise, the class the policy's
interactive_class names, build by default: not preemptible, within the
project's quota), wait for it, showing its place in the
queue and what holds it back, then attach this terminal to it. Keys, Ctrl-C,
Ctrl-Z and window size changes go to the job; gpuctl exits with the command's
exit status. With no command, the job runs your login shell in its working
directory, with its environment and GPUs (CUDA_VISIBLE_DEVICES). Ctrl-C while
it waits cancels the job. A lost connection leaves the terminal running for
the controller's detach timeout (10 minutes by default): `gpuctl attach JOB`.

With --in JOB, run the command (or a shell) inside a running job instead, on
its node, with its GPUs, as `srun` inside `salloc` does.
"""

RUN_EXAMPLES = """\
  gpuctl run -p vision --gpus 1                  # a shell on one GPU
  gpuctl run -p vision --gpus 1 --time 8h -- python -i explore.py
  gpuctl run --in 42 -- nvidia-smi               # inside running job 42
  gpuctl run --in 42                             # a second shell in job 42
"""


def add_parsers(subparsers) -> None:
    """Register ``run``, ``attach``, ``forward`` and ``notebook`` on the gpuctl sub-command parser."""
    run = add_verb(subparsers, "run", help="a shell or command on GPUs, attached to this terminal",
                   description=RUN_DESCRIPTION, examples=RUN_EXAMPLES, func=run_interactive)
    add_options(run)
    run.add_argument("--in", dest="inside", metavar="JOB", help="run inside this running job instead of a new one")
    run.add_argument("--task", type=int, default=0, metavar="N", help="with --in: the task to run in (default 0)")
    run.set_defaults(takes_command=True, command_argv=None)

    attach = add_verb(subparsers, "attach", help="reattach this terminal to an interactive job",
                      description="Attach this terminal to an interactive job's terminal again, after a lost "
                                  "connection: the output it made meanwhile is shown first.",
                      examples="  gpuctl attach 42\n", func=run_attach)
    attach.add_argument("job", help="job id")

    forward = add_verb(subparsers, "forward", help="forward a local port to a port of a job's node",
                       description="Forward 127.0.0.1:LOCALPORT here to PORT on the node of a running job "
                                   "(Jupyter, TensorBoard), through the controller. Only the job's owner and "
                                   "admins may, and only to a port a process of the job's user listens on. "
                                   "Runs until Ctrl-C.",
                       examples="  gpuctl forward 42 6006          # TensorBoard at http://127.0.0.1:6006\n"
                                "  gpuctl forward 42 8888:9999     # the job's 8888 at local 9999\n",
                       func=run_forward)
    forward.add_argument("job", help="job id")
    forward.add_argument("ports", metavar="PORT[:LOCALPORT]", help="the port on the node, and the local one")

    notebook = add_verb(subparsers, "notebook", help="Jupyter Lab on GPUs, at a local URL",
                        description="Start Jupyter Lab from your own environment (the jupyter on your PATH, "
                                    "which the job's node must see too) in an interactive job, forward it here "
                                    "and print its local URL with its token. Ctrl-C ends the notebook. "
                                    "Options after -- go to Jupyter Lab as they are. A notebook whose job runs "
                                    "as root gets --allow-root (Jupyter refuses root without it), with a notice.",
                        examples="  gpuctl notebook -p vision --gpus 1\n"
                                 "  gpuctl notebook -p vision --gpus 1 --port 9999\n"
                                 "  gpuctl notebook -p vision --gpus 1 -- --notebook-dir=~/work "
                                 "--ServerApp.iopub_data_rate_limit=1e10\n",
                        func=run_notebook)
    add_options(notebook)
    notebook.add_argument("--port", type=int, default=0, metavar="LOCALPORT",
                          help="local port for the notebook (default: any free one)")
    notebook.set_defaults(takes_command=True, command_argv=None)


# -- run and attach ----------------------------------------------------------

def refuse_batch_options(args: argparse.Namespace) -> None:
    """UsageError for options an interactive job (one task, one terminal, started now) cannot take."""
    given = [flag for flag, value in (("--array", args.array), ("--min-tasks", args.min_tasks), ("--hold", args.hold))
             if value is not None]
    if args.tasks is not None and args.tasks != 1:
        given.insert(1, "--tasks")
    if given:
        raise UsageError(f"{', '.join(given)} cannot be used here: an interactive job is one task with one terminal, "
                         "started as soon as it can be; for a gang or an array, `gpuctl submit` a batch job and "
                         "use `gpuctl run --in JOB` in it")


def run_interactive(args: argparse.Namespace) -> int:
    """Submit an interactive job, wait for it, and attach; or run inside a job (--in). Returns the exit status."""
    from gpud.client import job_path
    api = client()
    if args.inside:
        api.get(job_path(args.inside, "exec"))  # refusals (not yours, not running) with their full message
        params = [("task", str(args.task))] + [("argv", a) for a in args.command_argv or []]
        return _finish(api, args.inside, _attach(api, job_path(args.inside, "exec"), params), main=False)
    if args.command_argv is not None and not args.command_argv:
        raise UsageError("nothing to run after --; leave out -- for a shell")
    refuse_batch_options(args)
    return run_new(build_job(args, command=args.command_argv or None))


def run_new(job: dict) -> int:
    """Submit ``job`` (the API's job object) as an interactive job, wait for it and attach; returns the exit status."""
    from gpud.client import job_path
    api = client()
    job["interactive"] = True
    job_id = api.post("jobs", job)["ids"][0]
    print(f"gpuctl run: submitted interactive job {job_id}", file=sys.stderr)
    try:
        state = _wait(api, job_id)
    except NeverStarts as exc:
        print(exc, file=sys.stderr)
        return EXIT_REFUSED
    if state["state"] != "RUNNING":
        print(f"gpuctl run: job {job_id} ended {state['state']} before it started"
              f"{': ' + state['reason'] if state.get('reason') else ''}", file=sys.stderr)
        return EXIT_REFUSED
    nodes = ",".join(state.get("nodes") or [])
    print(f"gpuctl run: job {job_id} runs on {nodes}; attaching", file=sys.stderr)
    last = _attach(api, job_path(job_id, "attach"), [])
    if last is not None and last.get("refused"):
        # No terminal will ever attach to it: the job would hold its GPUs until the detach timeout.
        api.post(job_path(job_id, "cancel"))
        last = {**last, "error": f"{last['error']}; cancelled job {job_id}"}
    return _finish(api, job_id, last, main=True)


def run_attach(args: argparse.Namespace) -> int:
    """Reattach to an interactive job's terminal; returns its exit status once it ends."""
    from gpud.client import job_path
    api = client()
    api.get(job_path(args.job, "attach"))
    return _finish(api, args.job, _attach(api, job_path(args.job, "attach"), []), main=True)


class NeverStarts(Exception):
    """The job waited for can never start as asked; it has been cancelled. The message says why."""


def _wait(api, job_id: str, verb: str = "run") -> dict:
    """Wait until the job runs or ends, saying (when it changes) its place in the queue and why it waits.

    Ctrl-C cancels the job. A job the controller says can never start as
    asked is cancelled too, and NeverStarts says why: waiting would be forever.
    """
    from gpud.client import job_path
    shown = None
    try:
        while True:
            job = api.get(job_path(job_id))
            if job["state"] != "PENDING":
                return job
            why = api.get(job_path(job_id, "why"))
            if why.get("never"):
                api.post(job_path(job_id, "cancel"))
                raise NeverStarts(never_text(job_id, why, verb))
            text = waiting_text(job, api.get_all("jobs", {"state": "PENDING", "project": job["project"]})["jobs"], why)
            if text != shown:
                print(text, file=sys.stderr)
                shown = text
            time.sleep(WAIT_POLL_S)
    except KeyboardInterrupt:
        api.post(job_path(job_id, "cancel"))
        print(f"\ngpuctl run: cancelled job {job_id}, which had not started", file=sys.stderr)
        raise


def never_text(job_id: str, why: dict, verb: str) -> str:
    """Why a waited-for job was cancelled: what can never let it start, and what a person could change."""
    from gpud.cli.job_cmd import worded
    never = [b for b in why.get("blockers") or [] if b.get("never")] or why.get("blockers") or []
    lines = [f"gpuctl {verb}: job {job_id} can never start as asked, so it was cancelled:"]
    lines += [f"  - {worded(b)}" for b in never]
    lines += [f"  it could start after: {worded(w)}" for w in why.get("would_start") or []]
    return "\n".join(lines)


def queue_place(job: dict, pending: list[dict]) -> tuple[int, int]:
    """The job's place among its project's pending jobs in its pool, in the order the scheduler takes them."""
    pool = job.get("pool")
    same = [j for j in pending if j.get("pool") == pool and not j.get("hold")]
    same.sort(key=lambda j: (-j["priority"], j["submitted"], j["id"]))
    ids = [j["id"] for j in same]
    return (ids.index(job["id"]) + 1 if job["id"] in ids else len(ids) + 1), max(len(ids), 1)


def waiting_text(job: dict, pending: list[dict], why: dict) -> str:
    """What a waiting ``gpuctl run`` shows: the place in the queue, then each blocker."""
    from gpud.cli.job_cmd import worded
    place, count = queue_place(job, pending)
    blockers = why.get("blockers") or []
    lines = [f"gpuctl run: job {job['id']} waits, {place} of {count} in project {job['project']}'s queue"
             + (f": {why['reason']}" if why.get("reason") and not blockers else "")]
    lines += [f"  - {worded(b)}" for b in blockers]
    from gpud.cli.job_cmd import expected_text
    lines += [f"  expected: {expected_text(e)}" for e in why.get("expected") or []]
    lines += [f"  it would start with: {worded(w)}" for w in why.get("would_start") or []]
    if blockers and job.get("priority", 0) >= NON_PREEMPTIBLE:
        lines.append(f"  (class {job.get('priority_class')} is not preemptible, so it runs only within the project's "
                     f"quota; --priority interactive-preemptible may also use idle GPUs over it)")
    return "\n".join(lines)


def _attach(api, path: str, params: list[tuple[str, str]]) -> dict | None:
    import asyncio
    from gpud.cli.terminal import run_terminal
    import aiohttp
    try:
        return asyncio.run(run_terminal(api.url, api.token, path, params, tls=api.tls_context()))
    except aiohttp.WSServerHandshakeError as exc:
        from gpud.client import ClientError
        from gpud.cli.terminal import terminal_query
        query = {k: v for k, v in terminal_query(params) if k != "argv"}
        try:
            api.get(path, query)  # the same checks without the upgrade, to say why in the controller's words
        except ClientError as refused:
            return {"type": "error", "error": str(refused), "refused": True}
        return {"type": "error", "error": f"the controller refused the terminal (HTTP {exc.status})", "refused": True}
    except (aiohttp.ClientError, OSError) as exc:
        return {"type": "error", "error": f"cannot reach the controller at {api.url}: {exc}", "unreachable": True}


def _finish(api, job_id: str, last: dict | None, *, main: bool) -> int:
    """gpuctl's exit status for how the terminal ended, with a line on stderr unless the command just exited."""
    from gpud.client import ClientError, job_path
    if last is None:
        print(f"\r\ngpuctl: lost the connection to job {job_id}'s terminal; it keeps running for a while: "
              f"gpuctl attach {job_id}", file=sys.stderr)
        return EXIT_UNREACHABLE
    kind = last.get("type")
    if kind == "exit":
        if last.get("signal"):
            return 128 + int(last["signal"])
        return int(last.get("code") or 0)
    if kind == "error":
        print(f"gpuctl: {last.get('error')}", file=sys.stderr)
        return EXIT_UNREACHABLE if last.get("unreachable") else EXIT_REFUSED
    reason = last.get("reason") or "it ended"
    try:
        job = api.get(job_path(job_id))
        reason = f"{job['state']}" + (f": {job['reason']}" if job.get("reason") else "")
    except ClientError:
        pass
    print(f"\r\ngpuctl: job {job_id} ended {reason}", file=sys.stderr)
    return EXIT_REFUSED


# -- forward and notebook ----------------------------------------------------

def parse_ports(text: str) -> tuple[int, int]:
    """PORT or PORT:LOCALPORT as two port numbers (LOCALPORT defaults to PORT; 0 picks a free one)."""
    remote, _, local = text.partition(":")
    try:
        ports = int(remote), int(local) if local else int(remote)
    except ValueError:
        raise UsageError(f"bad ports {text!r}: write PORT or PORT:LOCALPORT, such as 8888 or 8888:9999") from None
    if not 0 < ports[0] < 65536 or not 0 <= ports[1] < 65536:
        raise UsageError(f"bad ports {text!r}: ports are 1 to 65535 (LOCALPORT 0: any free port)")
    return ports


def run_forward(args: argparse.Namespace) -> int:
    """Forward a local port to the job's node until Ctrl-C."""
    from gpud.client import job_path
    port, local = parse_ports(args.ports)
    api = client()
    where = api.get(job_path(args.job, "forward"), {"port": port})

    def ready(listening: int) -> None:
        print(f"gpuctl forward: 127.0.0.1:{listening} -> port {port} of job {args.job} on "
              f"{','.join(where.get('nodes') or [])}; Ctrl-C stops", file=sys.stderr, flush=True)
    return _serve_forward(api, args.job, port, local, ready)


def _serve_forward(api, job_id: str, port: int, local: int, ready) -> int:
    import asyncio
    from gpud.cli.terminal import forward_port
    try:
        asyncio.run(forward_port(api.url, api.token, job_id, port, local, ready, tls=api.tls_context()))
    except OSError as exc:
        print(f"gpuctl forward: cannot listen on 127.0.0.1:{local}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        pass
    return 0


def run_notebook(args: argparse.Namespace) -> int:
    """Start Jupyter Lab in an interactive job, forward it, print its URL; Ctrl-C ends it."""
    from gpud.client import ClientError, job_path
    refuse_batch_options(args)
    lab = shutil.which("jupyter-lab")
    if lab is None:
        raise UsageError("Jupyter Lab is not installed in this environment (no jupyter-lab on PATH); install it "
                         "(pip install jupyterlab) in the environment you run gpuctl from, which the job's node "
                         "must see too, then run gpuctl notebook again")
    token = secrets.token_hex(24)
    remote = NOTEBOOK_PORTS[0] + secrets.randbelow(NOTEBOOK_PORTS[1] - NOTEBOOK_PORTS[0])
    command = notebook_command(lab, remote, token, list(args.command_argv or []))
    api = client()
    if api.get("whoami").get("user") == "root" and "--allow-root" not in command:
        print("gpuctl notebook: the job runs as root, which Jupyter refuses unless told; passing --allow-root",
              file=sys.stderr)
        command.append("--allow-root")
    job = build_job(args, command=command)
    job["interactive"] = True
    job.setdefault("name", "notebook")
    job["env"] = {**job.get("env", {}), "PATH": os.environ.get("PATH", "")}
    job_id = api.post("jobs", job)["ids"][0]
    print(f"gpuctl notebook: submitted interactive job {job_id}", file=sys.stderr)
    try:
        try:
            state = _wait(api, job_id, "notebook")
        except NeverStarts as exc:
            print(exc, file=sys.stderr)
            return EXIT_REFUSED
        if state["state"] != "RUNNING":
            print(f"gpuctl notebook: job {job_id} ended {state['state']}: {state.get('reason')}", file=sys.stderr)
            return EXIT_REFUSED
        return _notebook(api, job_id, remote, token, args.port)
    except KeyboardInterrupt:
        return 130
    finally:
        try:
            if api.get(job_path(job_id))["state"] in ("PENDING", "RUNNING"):
                api.post(job_path(job_id, "cancel"))
                print(f"gpuctl notebook: ended job {job_id}", file=sys.stderr)
        except ClientError:
            pass


def notebook_command(lab: str, port: int, token: str, extra: list[str]) -> list[str]:
    """Jupyter Lab's command line: listening on the node's loopback at ``port`` with ``token``, then the
    user's own options (``gpuctl notebook -- ARGS``), which Jupyter reads after gpuctl's and so win."""
    return [lab, "--no-browser", "--ip=127.0.0.1", f"--port={port}", "--port-retries=0",
            f"--ServerApp.token={token}", "--ServerApp.open_browser=False", *extra]


def _notebook(api, job_id: str, remote: int, token: str, local: int) -> int:
    import asyncio
    """Start the notebook's terminal (its output goes to the job's log here), forward its port, print the URL."""
    from gpud.cli.terminal import run_terminal
    from gpud.client import job_path

    async def main() -> int:
        log_path = os.path.join(os.getcwd(), f"gpud-{job_id}-notebook.log")
        with open(log_path, "ab") as log:
            terminal = asyncio.create_task(run_terminal(api.url, api.token, job_path(job_id, "attach"), [],
                                                        stdin_fd=None, stdout_fd=log.fileno(),
                                                        tls=api.tls_context()))

            def ready(listening: int) -> None:
                print(f"gpuctl notebook: Jupyter Lab of job {job_id} (its output: {log_path}):\n"
                      f"  http://127.0.0.1:{listening}/lab?token={token}\nCtrl-C ends it.", flush=True)
            forwarding = asyncio.create_task(_when_listening(api, job_id, remote, local, ready, terminal))
            done, _ = await asyncio.wait({terminal, forwarding}, return_when=asyncio.FIRST_COMPLETED)
            forwarding.cancel()
            await asyncio.gather(forwarding, return_exceptions=True)
            if terminal in done:
                last = terminal.result()
                print(f"gpuctl notebook: Jupyter Lab ended ({_ended(last)}); its output is in {log_path}",
                      file=sys.stderr)
                return EXIT_REFUSED
            terminal.cancel()
            return 0

    return asyncio.run(main())


async def _when_listening(api, job_id: str, remote: int, local: int, ready, terminal) -> None:
    import asyncio
    """Wait until the notebook listens on the node, then forward to it."""
    import aiohttp
    from gpud.cli.terminal import forward_port, ws_url
    from gpud.client import job_path
    headers = {"Authorization": f"Bearer {api.token}"} if api.token else {}
    async with aiohttp.ClientSession() as http:
        while not terminal.done():
            async with http.ws_connect(ws_url(api.url, job_path(job_id, "forward")), params={"port": str(remote)},
                                       headers=headers, ssl=api.tls_context() or True) as ws:
                frame = await ws.receive(timeout=30)
                if frame.type == aiohttp.WSMsgType.TEXT and '"opened"' in frame.data:
                    break  # the node connected: the notebook listens
            await asyncio.sleep(0.5)
    await forward_port(api.url, api.token, job_id, remote, local, ready, tls=api.tls_context())


def _ended(last: dict | None) -> str:
    if last is None:
        return "the connection was lost"
    if last.get("type") == "exit":
        return f"exit {last.get('code')}" if last.get("signal") is None else f"signal {last.get('signal')}"
    return str(last.get("reason") or last.get("error") or "ended")
