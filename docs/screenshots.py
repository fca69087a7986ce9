#!/usr/bin/env python3
"""Regenerate docs/images/ui-*.png: every dashboard page, in headless Chromium, over a fresh ``gpud up``.

    .venv/bin/python docs/screenshots.py [--out docs/images]

Needs Debian's chromium and chromium-driver (apt-get install chromium chromium-driver) and selenium
(in the test extra). The cluster is a throwaway one in a temporary directory with eight fake GPUs, a
department with two projects, and a few jobs: some running, an array and a too-large job waiting.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

POLICY = """\
min_runtime = 0

[[departments]]
name = "research"
gpu_quota = 6

[[projects]]
name = "vision"
department = "research"
gpu_quota = 4

[[projects]]
name = "speech"
department = "research"
gpu_quota = 2

[[projects]]
name = "default"
gpu_quota = 2
"""
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,860", "--hide-scrollbars")
PAGES = (("overview", ""), ("queue", "queue"), ("job", "jobs/{job}"), ("projects", "projects"),
         ("nodes", "nodes"), ("usage", "usage?by=project&window=day"))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait(check, what: str, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.2)
    raise SystemExit(f"screenshots: timed out waiting for {what}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "images"))
    args = parser.parse_args()
    from selenium import webdriver
    from selenium.webdriver.common.by import By

    chromium, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    if not chromium or not driver_path:
        print("screenshots: install chromium and chromium-driver first", file=sys.stderr)
        return 2
    root = Path(tempfile.mkdtemp(prefix="gpud-shots-"))
    (root / "policy.toml").write_text(POLICY)
    (root / "work").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUD_")}
    env.update(HOME=str(root / "home"), XDG_CONFIG_HOME=str(root / "config"))
    log = open(root / "up.log", "wb")
    up = subprocess.Popen([sys.executable, "-m", "gpud.cli.gpud_main", "up", "--fake-gpus", "8", "--port",
                           str(free_port()), "--state-dir", str(root / "state"), "--policy", str(root / "policy.toml")],
                          env=env, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    driver = None
    ids: list[str] = []
    gpuctl = None
    try:
        text = wait(lambda: (lambda t: t if "gpuctl is set up" in t else "")((root / "up.log").read_text()),
                    "gpud up")
        base = re.search(r"dashboard on (http://\S+/ui/)", text).group(1)

        def gpuctl(*argv: str) -> str:
            done = subprocess.run([sys.executable, "-m", "gpud.cli.gpuctl", *argv], env=env, cwd=root / "work",
                                  capture_output=True, text=True, timeout=60, check=True)
            return done.stdout.strip()

        def submit(*argv: str) -> str:
            ids.append(gpuctl("submit", "--parsable", *argv).split(";")[0])
            return ids[-1]

        job = submit("-p", "vision", "--name", "resnet-sweep-lr3e-4", "--gpus", "2", "--",
                     "sh", "-c", "for i in $(seq 1 100); do echo epoch $i loss 0.$((99 - i % 90)); sleep 1; done")
        submit("-p", "vision", "--name", "vit-finetune", "--gpus", "2", "--", "sleep", "3600")
        submit("-p", "speech", "--name", "whisper-eval", "--gpus", "1", "--", "sleep", "3600")
        submit("-p", "speech", "--name", "asr-hpo", "--array", "0-7", "--gpus", "1", "--", "sleep", "3600")
        submit("-p", "default", "--name", "llm-pretrain", "--gpus", "8", "--", "sleep", "3600")
        submit("-p", "default", "--name", "notebook", "--gpus", "0.5", "--", "sleep", "3600")
        token = (root / "state" / "controller" / "admin.token").read_text().strip()
        options = webdriver.ChromeOptions()
        options.binary_location = chromium
        for flag in (*FLAGS, f"--user-data-dir={root / 'profile'}"):
            options.add_argument(flag)
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=driver_path))
        driver.get(base)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(args.out) / "ui-login.png"))
        field = driver.find_element(By.ID, "token")
        field.send_keys(token)
        field.submit()
        wait(lambda: "/ui/login" not in driver.current_url, "sign-in")
        time.sleep(4)  # the job's log gets a few lines
        for name, path in PAGES:
            driver.get(base + path.format(job=job))
            wait(lambda: driver.find_elements(By.TAG_NAME, "h1"), name)
            if name == "queue":
                for details in driver.find_elements(By.TAG_NAME, "summary")[:1]:
                    details.click()
            if name == "job":
                wait(lambda: "epoch" in driver.find_element(By.ID, "log").text, "the job's log")
            target = Path(args.out) / f"ui-{name}.png"
            driver.save_screenshot(str(target))
            print(f"wrote {target}")
    finally:
        if driver is not None:
            driver.quit()
        if gpuctl is not None and ids:  # gpud up leaves running jobs running when it stops: end them first
            gpuctl("cancel", *ids)
            wait(lambda: not [j for j in json.loads(gpuctl("queue", "--json"))["jobs"] if j["state"] == "RUNNING"],
                 "the jobs to stop")
        up.send_signal(signal.SIGTERM)
        try:
            up.wait(20)
        except subprocess.TimeoutExpired:
            up.kill()
        log.close()
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
