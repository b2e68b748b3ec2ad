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
from operator import itemgetter
from typing import Any

import pluggy
import structlog

from qpid_flow import hookspecs
from qpid_flow.model import Hold, Reject

__all__ = ["BUILTIN_PLUGINS", "PLUGIN_ERRORS", "Hooks", "build_plugin_manager"]

log = structlog.get_logger(__name__)

# Exceptions plugins raised, by hook (qpid_flow_plugin_errors_total): counted on the error
# path only, read by the metrics at scrape time.
PLUGIN_ERRORS: Counter[str] = Counter()

ENTRY_POINT_GROUP = "qpid_flow"

# name -> module; each module's ``Plugin()`` is registered (its methods carry @hookimpl).
BUILTIN_PLUGINS: dict[str, str] = {
    "passthrough": "qpid_flow.builtin.passthrough",
    "flow": "qpid_flow.builtin.flow",
    "groups": "qpid_flow.builtin.groups",
    "events": "qpid_flow.builtin.events",
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


def _positional(function: Callable[..., Any], names: tuple[str, ...]) -> Callable[[dict[str, Any]], Any]:
    """``function`` called with the keyword arguments it names, taken from a dict, in order.

    ``operator.itemgetter`` picks them in C; one or no argument (most hooks) needs no
    tuple at all."""
    if not names:
        return lambda _kwargs: function()
    if len(names) == 1:
        (name,) = names
        return lambda kwargs: function(kwargs[name])
    pick = itemgetter(*names)
    return lambda kwargs: function(*pick(kwargs))


def _direct(caller: Any) -> Callable[[dict[str, Any]], Any] | None:
    """A plain-Python caller equivalent to pluggy's for this hook (taking the keyword
    arguments as one dict), or None if it needs pluggy.

    pluggy's general machinery costs microseconds per call, and some hooks run several
    times per message. When no implementation is a wrapper, calling the implementations in
    pluggy's order (last registered first, ``tryfirst``/``trylast`` honoured), each with the
    arguments it asks for, is the same thing, several times cheaper.
    """
    impls = caller.get_hookimpls()
    if any(impl.hookwrapper or impl.wrapper for impl in impls):
        return None
    firstresult = bool(caller.spec and caller.spec.opts.get("firstresult"))
    ordered = [_positional(impl.function, tuple(impl.argnames)) for impl in reversed(impls)]
    if len(ordered) == 1 and firstresult:
        return ordered[0]  # the most common shape: no loop, no extra frame
    if firstresult:

        def first(kwargs: dict[str, Any]) -> Any:
            for call in ordered:
                result = call(kwargs)
                if result is not None:
                    return result
            return None

        return first

    def collect(kwargs: dict[str, Any]) -> list[Any]:
        results = []
        for call in ordered:
            result = call(kwargs)
            if result is not None:
                results.append(result)
        return results

    return collect


def _guarded(caller: Any, hook: str, fallback: Any) -> Callable[..., Any]:
    direct = _direct(caller)

    if direct is None:

        def through_pluggy(**kwargs: Any) -> Any:
            try:
                return caller(**kwargs)
            except Exception:
                PLUGIN_ERRORS[hook] += 1
                log.exception("plugin_error", hook=hook)
                return fallback

        return through_pluggy

    def call(**kwargs: Any) -> Any:
        try:
            return direct(kwargs)
        except Exception:
            PLUGIN_ERRORS[hook] += 1
            log.exception("plugin_error", hook=hook)
            return fallback

    return call


def _single_notification(function: Callable[..., Any], names: tuple[str, ...], hook: str) -> Callable[..., None]:
    """A notification only one plugin implements (the event log's per-message hooks, when
    it is on): its function called with the arguments it names, in one frame. Several of
    these run for every message; the general path costs two frames and a loop more."""
    if len(names) == 1:
        (name,) = names

        def call_one(**kwargs: Any) -> None:
            try:
                function(kwargs[name])
            except Exception:
                PLUGIN_ERRORS[hook] += 1
                log.exception("plugin_error", hook=hook)

        return call_one
    pick = itemgetter(*names) if names else (lambda _kwargs: ())

    def call(**kwargs: Any) -> None:
        try:
            function(*pick(kwargs))
        except Exception:
            PLUGIN_ERRORS[hook] += 1
            log.exception("plugin_error", hook=hook)

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
        self.configure = self._notify(h.qpid_flow_configure)
        self.started = self._notify(h.qpid_flow_started)
        self.stopping = self._notify(h.qpid_flow_stopping)
        self.destination_created = self._notify(h.qpid_flow_destination_created)
        self.destination_deleted = self._notify(h.qpid_flow_destination_deleted)
        self.destination_policy_changed = self._notify(h.qpid_flow_destination_policy_changed)
        self.depth_changed = self._notify(h.qpid_flow_depth_changed)
        self.flow_changed = self._notify(h.qpid_flow_flow_changed)
        self.destination_stats = self._notify(h.qpid_flow_destination_stats)
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
        self.producer_credit = _guarded(h.qpid_flow_producer_credit, "qpid_flow_producer_credit", 0)
        self.transfer_arrived = _guarded(
            h.qpid_flow_transfer_arrived,
            "qpid_flow_transfer_arrived",
            Reject("a qpid-flow policy failed on this transfer", condition="amqp:internal-error"),
        )
        self.settlement_delay = _guarded(h.qpid_flow_settlement_delay, "qpid_flow_settlement_delay", False)
        self.consumer_select = _guarded(h.qpid_flow_consumer_select, "qpid_flow_consumer_select", Hold("policy error"))

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
        impls = caller.get_hookimpls()
        if not impls:
            return _noop
        if len(impls) == 1 and not (impls[0].hookwrapper or impls[0].wrapper):
            return _single_notification(impls[0].function, tuple(impls[0].argnames), caller.name)
        return _guarded(caller, caller.name, None)
