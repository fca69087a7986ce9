"""Builds the plugin manager: built-in policies, entry-point plugins, then site-local files."""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import pluggy

from gpud import hookspecs
from gpud.errors import ConfigError

BUILTIN_PLUGINS = (
    "gpud.policies.binpack",
    "gpud.policies.spread",
    "gpud.policies.fragaware",
    "gpud.policies.job_order",
    "gpud.policies.queue_order",
    "gpud.policies.victim_order",
    "gpud.policies.timeslice",
)
ENTRY_POINT_GROUP = "gpud"
TRACE_ENV = "GPUD_TRACE_HOOKS"


class PluginManager(pluggy.PluginManager):
    """pluggy's plugin manager, which says whether its hook calls are monitored (traced)."""

    def __init__(self, project_name: str) -> None:
        super().__init__(project_name)
        # Once True, the scheduler calls every hook through pluggy (gpud.core.hooks.traced), so the
        # monitor sees each call; it stays True after the monitor is removed, which only costs speed.
        self.monitored = False

    def add_hookcall_monitoring(self, before: Callable[..., Any], after: Callable[..., Any]) -> Callable[[], None]:
        """pluggy's, and from now on every hook call goes through pluggy."""
        self.monitored = True
        return super().add_hookcall_monitoring(before, after)


def short_name(module_name: str) -> str:
    """The name a policy file uses for a plugin module: its last dotted part."""
    return module_name.rsplit(".", 1)[-1]


def make_plugin_manager(disable: Iterable[str] = (), directory: str | os.PathLike | None = None,
                        load_entry_points: bool = True) -> pluggy.PluginManager:
    """Return a plugin manager with every enabled plugin registered.

    Load order: the built-in policies, the ``gpud`` entry-point group, then the
    ``*.py`` files of ``directory``. A built-in module is registered as its
    ``PLUGIN`` object where it has one (a policy object the core calls
    directly, gpud.core.policy_set), else as itself. A name in ``disable`` (a plugin's short
    name such as ``"spread"`` or its full module name) is not registered;
    a name that matches no built-in and no entry point is a ConfigError.
    A plugin whose marked function names no hook of ``gpud.hookspecs`` (a
    misspelt hook), or whose arguments are not the hook's, is a ConfigError
    naming the plugin and the function. Setting the environment variable
    GPUD_TRACE_HOOKS prints every hook call.
    """
    pm = PluginManager("gpud")
    pm.add_hookspecs(hookspecs)
    blocked = set(disable)
    known = set()
    for module_name in BUILTIN_PLUGINS:
        known.update({module_name, short_name(module_name)})
        if module_name in blocked or short_name(module_name) in blocked:
            pm.set_blocked(short_name(module_name))
            continue
        module = importlib.import_module(module_name)
        pm.register(getattr(module, "PLUGIN", module), name=short_name(module_name))
    if load_entry_points:
        for name in blocked:
            pm.set_blocked(name)
        try:
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        except pluggy.PluginValidationError as exc:
            raise _invalid(pm, exc) from exc
        known.update(ep_name for ep_name, _ in _entry_point_names())
    if directory is not None:
        for module in load_directory(directory):
            known.add(module.__name__)
            if module.__name__ not in blocked:
                try:
                    pm.register(module, name=module.__name__)
                except pluggy.PluginValidationError as exc:
                    raise _invalid(pm, exc) from exc
    check_hooks(pm)
    unknown = sorted(blocked - known)
    if unknown:
        raise ConfigError("policy", "plugins.disable",
                          f"no plugin named {', '.join(map(repr, unknown))}; "
                          f"plugins: {', '.join(sorted(short_name(m) for m in BUILTIN_PLUGINS))}")
    if os.environ.get(TRACE_ENV):
        pm.trace.root.setwriter(lambda msg: sys.stderr.write(msg))
        pm.enable_tracing()
    return pm


def check_hooks(pm: pluggy.PluginManager) -> None:
    """Refuse a registered plugin that implements a hook ``gpud.hookspecs`` does not declare.

    pluggy's ``check_pending`` finds such an implementation (usually a
    misspelt hook name, which would otherwise never be called); the
    ConfigError names the plugin, its file, the function and the nearest
    hook name.
    """
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        for name, caller in vars(pm.hook).items():
            if name.startswith("_") or caller.has_spec():
                continue
            for impl in caller.get_hookimpls():
                if not impl.optionalhook:
                    nearest = difflib.get_close_matches(name, _hook_names(), n=1)
                    hint = f" (did you mean {nearest[0]!r}?)" if nearest else ""
                    raise ConfigError(_source(impl.plugin), "",
                                      f"plugin {impl.plugin_name!r} implements {name!r}, which is no gpud "
                                      f"hook{hint}; the hooks are listed in docs/plugins.md") from exc
        raise _invalid(pm, exc) from exc


def _invalid(pm: pluggy.PluginManager, exc: pluggy.PluginValidationError) -> ConfigError:
    """A ConfigError for a plugin pluggy refused (an unknown hook, or arguments the hook does not have)."""
    name = pm.get_name(exc.plugin) or getattr(exc.plugin, "__name__", repr(exc.plugin))
    return ConfigError(_source(exc.plugin), "", f"plugin {name!r} is not a valid gpud plugin: {exc}")


def _source(plugin: object) -> str:
    """The file a plugin module was loaded from, or its name when it has none."""
    return str(getattr(plugin, "__file__", None) or getattr(plugin, "__name__", repr(plugin)))


def _hook_names() -> list[str]:
    return [name for name in vars(hookspecs) if name.startswith("gpud_")]


def _entry_point_names() -> list[tuple[str, str]]:
    from importlib.metadata import entry_points
    return [(ep.name, ep.value) for ep in entry_points(group=ENTRY_POINT_GROUP)]


def load_directory(directory: str | os.PathLike) -> list:
    """Import every ``*.py`` file of ``directory`` as a module named after the file, in name order."""
    folder = Path(directory)
    if not folder.is_dir():
        raise ConfigError(str(folder), "", "plugins directory does not exist")
    modules = []
    for path in sorted(folder.glob("*.py")):
        spec = importlib.util.spec_from_file_location(f"gpud_site_{path.stem}", path)
        assert spec is not None and spec.loader is not None  # a *.py path always has both
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as exc:  # a broken site plugin must name itself
            raise ConfigError(str(path), "", f"plugin failed to load: {exc!r}") from exc
        module.__name__ = path.stem
        modules.append(module)
    return modules


def placement_strategies(pm: pluggy.PluginManager) -> frozenset[str]:
    """Every placement strategy name some registered plugin implements."""
    names: set[str] = set()
    for result in pm.hook.gpud_placement_strategies():
        names.update(result)
    return frozenset(names)
