"""A gpud lifecycle plugin: POST each job event (submitted, started, finished, preempted) as JSON to a URL.

Configured from the controller's environment (for the systemd unit: a drop-in
with ``Environment=``):

- ``GPUD_WEBHOOK_URL``: where to POST; without it the plugin does nothing.
- ``GPUD_WEBHOOK_EVENTS``: a comma-separated subset of the four events (default all).
- ``GPUD_WEBHOOK_SECRET``: when set, ``X-Gpud-Signature: sha256=<hex>`` carries
  the HMAC-SHA256 of the body, so the receiver can tell the controller sent it.
- ``GPUD_WEBHOOK_TIMEOUT``: seconds per attempt (default 5); one retry after a failure.

The controller calls ``gpud_job_event`` on a worker thread, in event order,
so a slow receiver delays later notifications, never scheduling.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time
import urllib.error
import urllib.request
from typing import Any, Mapping

from gpud import __version__ as gpud_version
from gpud import hookimpl

log = logging.getLogger("gpud.webhook")
EVENTS = ("submitted", "started", "finished", "preempted")
ATTEMPTS = 2


def settings(env: Mapping[str, str] = os.environ) -> dict[str, Any] | None:
    """The webhook's settings from ``env``, or None when no URL is set."""
    url = env.get("GPUD_WEBHOOK_URL", "").strip()
    if not url:
        return None
    events = [e.strip() for e in env.get("GPUD_WEBHOOK_EVENTS", "").split(",") if e.strip()] or list(EVENTS)
    return {"url": url, "events": frozenset(events), "secret": env.get("GPUD_WEBHOOK_SECRET", ""),
            "timeout": float(env.get("GPUD_WEBHOOK_TIMEOUT", "5") or 5)}


def payload(event: str, job: Any, detail: dict) -> dict:
    """The JSON document sent for one event: the event, the job as the scheduler sees it, and the detail."""
    request = job.request
    return {"event": event, "time": time.time(), "gpud_version": gpud_version,
            "job": {"id": job.id, "project": job.project, "priority": job.priority, "tasks": job.tasks,
                    "gpus_per_task": request.gpus, "gpu_memory_gib": request.gpu_memory_gib,
                    "pool": job.pool, "submitted": job.submitted, "started": job.started},
            "detail": detail}


def signature(secret: str, body: bytes) -> str:
    """The ``X-Gpud-Signature`` header value of ``body``."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def post(url: str, body: bytes, headers: dict[str, str], timeout: float) -> bool:
    """POST ``body``; True on a 2xx answer. Retries once; logs and gives up after that."""
    for attempt in range(ATTEMPTS):
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as answer:
                if 200 <= answer.status < 300:
                    return True
        except urllib.error.HTTPError as exc:
            if 400 <= exc.code < 500:  # the receiver refuses this body; sending it again will not help
                log.warning("webhook %s refused the event: HTTP %s", url, exc.code)
                return False
            error = f"HTTP {exc.code}"
        except (OSError, ValueError) as exc:
            error = str(exc)
        else:
            error = "unexpected answer"
        if attempt + 1 < ATTEMPTS:
            time.sleep(0.5)
    log.warning("webhook %s failed: %s", url, error)
    return False


@hookimpl
def gpud_job_event(event, job, detail):
    """POST the event when a URL is configured and the event is wanted."""
    config = settings()
    if config is None or event not in config["events"]:
        return None
    body = json.dumps(payload(event, job, detail)).encode()
    headers = {"Content-Type": "application/json", "User-Agent": f"gpud-webhook/{gpud_version}"}
    if config["secret"]:
        headers["X-Gpud-Signature"] = signature(config["secret"], body)
    post(config["url"], body, headers, config["timeout"])
    return None
