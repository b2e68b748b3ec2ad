"""Build the plugin manager and the typed facade the data path calls hooks through.

Registration order (later registrations are asked first by pluggy, and built-ins are
``trylast`` anyway): built-ins, then plugins from the ``qpid_flow`` entry-point group,
then modules named in ``$QPID_FLOW_PLUGINS``. Any of them can be disabled by name
(``disable_plugins`` in the configuration, ``--disable-plugin`` or
``$QPID_FLOW_DISABLE_PLUGINS``).

A plugin that raises never takes the router down: the error is logged, and a
question hook falls back to the safest answer (no credit, reject the transfer,
let the message wait).
"""

from __future__ import annotations

import importlib
import os
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

import pluggy
import structlog

from qpid_flow.core.model import Hold, Reject
from qpid_flow.plugin import hookspecs

__all__ = ["BUILTIN_PLUGINS", "PLUGIN_ERRORS", "Hooks", "build_plugin_manager"]

log = structlog.get_logger(__name__)

# Exceptions plugins raised, by hook (qpid_flow_plugin_errors_total): counted on the error
# path only, read by the metrics at scrape time.
PLUGIN_ERRORS: Counter[str] = Counter()

ENTRY_POINT_GROUP = "qpid_flow"

# name -> module; each module's ``Plugin()`` is registered (its methods carry @hookimpl).
BUILTIN_PLUGINS: dict[str, str] = {
    "passthrough": "qpid_flow.policies.passthrough",
    "flow": "qpid_flow.policies.flow_control.plugin",
    "groups": "qpid_flow.policies.groups.plugin",
    "events": "qpid_flow.policies.event_log.plugin",
}


def _names_from_env(variable: str) -> list[str]:
    return [name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()]


def build_plugin_manager(disabled: Iterable[str] = ()) -> pluggy.PluginManager:
    """A plugin manager with every hook, the built-ins, and the installed plugins."""
    pm = pluggy.PluginManager("qpid_flow")
    pm.add_hookspecs(hookspecs)
    blocked = set(disabled) | set(_names_from_env("QPID_FLOW_DISABLE_PLUGINS"))
    for name in blocked:
        pm.set_blocked(name)
    for name, module_name in BUILTIN_PLUGINS.items():
        if name not in blocked:
            pm.register(importlib.import_module(module_name).Plugin(), name=name)
    pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for module_name in _names_from_env("QPID_FLOW_PLUGINS"):
        if module_name not in blocked and pm.get_plugin(module_name) is None:
            pm.register(importlib.import_module(module_name), name=module_name)
    pm.check_pending()
    return pm


def _caller_source(spec_args: tuple[str, ...], impl_args: list[tuple[str, ...]], mode: str) -> str:
    """The text of a caller taking the hook's arguments by keyword and calling each
    implementation (``f0``, ``f1``, ... in pluggy's order) with the ones it names.

    ``mode``: ``"first"`` (the first non-None answer, else None), ``"collect"`` (the list of
    non-None answers) or ``"notify"`` (nothing)."""
    lines = [f"def call(*, {', '.join(spec_args)}):" if spec_args else "def call():", "    try:"]
    if mode == "collect":
        lines.append("        results = []")
    for index, args in enumerate(impl_args):
        invocation = f"f{index}({', '.join(args)})"
        if mode == "first":
            lines += [f"        result = {invocation}", "        if result is not None:", "            return result"]
        elif mode == "collect":
            lines += [
                f"        result = {invocation}",
                "        if result is not None:",
                "            results.append(result)",
            ]
        else:
            lines.append(f"        {invocation}")
    lines.append("        return results" if mode == "collect" else "        return None")
    lines += [
        "    except Exception:",
        "        PLUGIN_ERRORS[hook] += 1",
        '        log.exception("plugin_error", hook=hook)',
        "        return fallback",
    ]
    return "\n".join(lines)


def _compiled(caller: Any, mode: str, fallback: Any) -> Callable[..., Any] | None:
    """A plain-Python caller that answers as pluggy does for this hook, or None if it
    needs pluggy (an implementation is a wrapper).

    pluggy's general machinery costs microseconds per call, and some hooks run several
    times per message. When no implementation is a wrapper, calling the implementations in
    pluggy's order (last registered first, ``tryfirst``/``trylast`` honoured), each with the
    arguments it asks for, is the same thing. The caller is generated with the hook's own
    parameters (as ``dataclasses`` generates ``__init__``): a call costs about what a call
    of a plain function does, a third of unpacking ``**kwargs``."""
    impls = list(reversed(caller.get_hookimpls()))
    if caller.spec is None or any(impl.hookwrapper or impl.wrapper for impl in impls):
        return None
    namespace: dict[str, Any] = {
        "PLUGIN_ERRORS": PLUGIN_ERRORS,
        "log": log,
        "hook": caller.name,
        "fallback": fallback,
    }
    namespace.update({f"f{index}": impl.function for index, impl in enumerate(impls)})
    source = _caller_source(tuple(caller.spec.argnames), [tuple(impl.argnames) for impl in impls], mode)
    exec(compile(source, f"<qpid_flow hook caller {caller.name}>", "exec"), namespace)
    function: Callable[..., Any] = namespace["call"]
    return function


def _guarded(caller: Any, fallback: Any, collect: bool = False) -> Callable[..., Any]:
    """The caller of a hook: compiled (:func:`_compiled`) unless an implementation is a
    wrapper, then through pluggy; either way a plugin's exception is logged, counted and
    answered with ``fallback``."""
    hook = caller.name
    firstresult = caller.spec is not None and caller.spec.opts.get("firstresult")
    mode = "first" if firstresult else "collect" if collect else "notify"
    compiled = _compiled(caller, mode, fallback)
    if compiled is not None:
        return compiled

    def through_pluggy(**kwargs: Any) -> Any:
        try:
            results = caller(**kwargs)
        except Exception:
            PLUGIN_ERRORS[hook] += 1
            log.exception("plugin_error", hook=hook)
            return fallback
        return None if mode == "notify" else results

    return through_pluggy


def _refusable(caller: Any) -> Callable[..., None]:
    """The caller of the start-up hook whose implementations may refuse the configuration:
    a :class:`~qpid_flow.config.ConfigError` goes on to the caller (qpid-flow does not start
    and prints its one line); any other exception is logged and counted like any hook's."""
    from qpid_flow.config import ConfigError

    def call(**kwargs: Any) -> None:
        try:
            caller(**kwargs)
        except ConfigError:
            raise
        except Exception:
            PLUGIN_ERRORS[caller.name] += 1
            log.exception("plugin_error", hook=caller.name)

    return call


def _noop(**_kwargs: Any) -> None:
    return None


class Hooks:
    """One attribute per hook, called with keyword arguments.

    Notification hooks that no plugin implements become no-ops, so an unused hook
    costs nothing on the per-message path.
    """

    def __init__(self, pm: pluggy.PluginManager) -> None:
        self.pm = pm
        h = pm.hook
        self.configure = _refusable(h.qpid_flow_configure)
        self.started = self._notify(h.qpid_flow_started)
        self.stopping = self._notify(h.qpid_flow_stopping)
        self.destination_created = self._notify(h.qpid_flow_destination_created)
        self.destination_deleted = self._notify(h.qpid_flow_destination_deleted)
        self.destination_policy_changed = self._notify(h.qpid_flow_destination_policy_changed)
        self.depth_changed = self._notify(h.qpid_flow_depth_changed)
        self.flow_changed = self._notify(h.qpid_flow_flow_changed)
        # A notification whose answers are read (the records' extra statistics).
        self.destination_stats = _guarded(h.qpid_flow_destination_stats, [], collect=True)
        self.producer_attached = self._notify(h.qpid_flow_producer_attached)
        self.producer_detached = self._notify(h.qpid_flow_producer_detached)
        self.transfer_settled = self._notify(h.qpid_flow_transfer_settled)
        self.consumer_attached = self._notify(h.qpid_flow_consumer_attached)
        self.consumer_detached = self._notify(h.qpid_flow_consumer_detached)
        self.group_assigned = self._notify(h.qpid_flow_group_assigned)
        self.group_released = self._notify(h.qpid_flow_group_released)
        self.message_enqueued = self._notify(h.qpid_flow_message_enqueued)
        self.message_delivered = self._notify(h.qpid_flow_message_delivered)
        self.message_settled = self._notify(h.qpid_flow_message_settled)
        self.producer_credit = _guarded(h.qpid_flow_producer_credit, 0)
        self.transfer_arrived = _guarded(
            h.qpid_flow_transfer_arrived,
            Reject("a qpid-flow policy failed on this transfer", condition="amqp:internal-error"),
        )
        self.settlement_delay = _guarded(h.qpid_flow_settlement_delay, False)
        self.consumer_select = _guarded(h.qpid_flow_consumer_select, Hold("policy error"))

    def listens(self, name: str) -> bool:
        """Whether any plugin implements the notification ``name`` (an attribute above):
        a caller may skip building what only that notification would use."""
        return getattr(self, name) is not _noop

    def builtin_only(self, hook: str) -> bool:
        """Whether every implementation of ``hook`` (its full name) is a built-in plugin's:
        a caller may then rely on what the built-ins answer."""
        return all(impl.plugin_name in BUILTIN_PLUGINS for impl in getattr(self.pm.hook, hook).get_hookimpls())

    def listened(self, *notifications: str) -> bool:
        """Whether some plugin implements one of these notification hooks (by attribute
        name, e.g. ``"group_assigned"``): a caller may skip preparing what nobody reads."""
        return any(getattr(self, name) is not _noop for name in notifications)

    @staticmethod
    def _notify(caller: Any) -> Callable[..., Any]:
        if not caller.get_hookimpls():
            return _noop
        return _guarded(caller, None)
