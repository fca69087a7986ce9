"""Startup hook of tasks with a GPU memory slice: caps PyTorch's per-process memory once torch is imported.

The node puts this directory first on the task's PYTHONPATH. It reads
GPUD_GPU_MEMORY_FRACTION, sets ``torch.cuda.set_per_process_memory_fraction``
on every visible device right after ``import torch`` succeeds, then runs the
site's own sitecustomize, if any, so nothing the host set up is lost.
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _cap_torch(torch) -> None:
    try:
        fraction = float(os.environ.get("GPUD_GPU_MEMORY_FRACTION", ""))
    except ValueError:
        return
    try:
        if 0 < fraction < 1 and torch.cuda.is_available():
            for device in range(torch.cuda.device_count()):
                torch.cuda.set_per_process_memory_fraction(fraction, device)
    except Exception as exc:  # noqa: BLE001 - a cap that cannot be set must not break the job
        print(f"gpud: could not cap PyTorch GPU memory: {exc}", file=sys.stderr)


class _TorchWatcher(importlib.abc.MetaPathFinder):
    """Lets ``import torch`` happen as usual, then caps its memory."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        original = loader.exec_module

        def exec_module(module):
            original(module)
            _cap_torch(module)
        loader.exec_module = exec_module
        return spec


def _chain_site_hook() -> None:
    """Run the sitecustomize this one hides (the next one on sys.path)."""
    rest = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("GPUD_GPU_MEMORY_FRACTION"):
    sys.meta_path.insert(0, _TorchWatcher())
_chain_site_hook()
