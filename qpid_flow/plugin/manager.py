"""Build the plugin manager and the typed facade the data path calls hooks through.

Registration order (pluggy asks the last registered first, so an installed plugin is
asked before the built-ins; only the pass-through policy is also ``trylast``): built-ins,
then plugins from the ``qpid_flow`` entry-point group, then modules named in
``$QPID_FLOW_PLUGINS``. Any of them can be disabled by name
(``disable_plugins`` in the configuration, ``--disable-plugin`` or
``$QPID_FLOW_DISABLE_PLUGINS``).

A plugin that raises never takes the router down: the error is logged, and a
question hook falls back to the safest answer (no credit, reject the transfer,
let the message wait).
"""

from __future__ import annotations

import importlib
import os
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pluggy
import structlog

from qpid_flow.core.model import Hold, Reject

if TYPE_CHECKING:
    from qpid_flow.config import DestinationPolicy, RouterConfig
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.model import Consumer, Decision, Message, Producer, Settlement
    from qpid_flow.plugin.control import RouterControl
    from qpid_flow.plugin.declarations import AdminRoute, DestinationSetting
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


def build_plugin_manager(disabled: Iterable[str] = (), *, installed: bool = True) -> pluggy.PluginManager:
    """A plugin manager with every hook, the built-ins, and (``installed``) the plugins of
    the entry-point group and of ``$QPID_FLOW_PLUGINS``."""
    pm = pluggy.PluginManager("qpid_flow")
    pm.add_hookspecs(hookspecs)
    blocked = set(disabled) | set(_names_from_env("QPID_FLOW_DISABLE_PLUGINS"))
    for name in blocked:
        pm.set_blocked(name)
    for name, module_name in BUILTIN_PLUGINS.items():
        if name not in blocked:
            pm.register(importlib.import_module(module_name).Plugin(), name=name)
    if installed:
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


def refusable(caller: Any) -> Callable[..., None]:
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


# What a hook answers when an implementation raises (the safest answer), by hook.
_FALLBACKS: dict[str, Any] = {
    "qpid_flow_producer_credit": 0,
    "qpid_flow_transfer_arrived": Reject("a qpid-flow policy failed on this transfer", condition="amqp:internal-error"),
    "qpid_flow_settlement_delay": False,
    "qpid_flow_consumer_select": Hold("policy error"),
    "qpid_flow_producers_held": False,
    "qpid_flow_destination_stats": [],
}
# Hooks asked at start only (or whose ConfigError must reach the caller): always through pluggy.
_AT_START = frozenset(
    {
        "qpid_flow_configure",
        "qpid_flow_destination_policy_check",
        "qpid_flow_destination_settings",
        "qpid_flow_admin_routes",
        "qpid_flow_started",
    }
)
# Notifications whose answers are read: collected, not dropped.
_COLLECTED = frozenset({"qpid_flow_destination_stats"})

TRACE_ENVIRONMENT = "QPID_FLOW_TRACE_HOOKS"
_TRACED: weakref.WeakSet[pluggy.PluginManager] = weakref.WeakSet()


class Hooks:
    """How qpid-flow calls its hooks: one typed method per hook, called with keywords.

    **Snapshot (the default).** At construction every hook the data path calls is bound to
    a caller compiled for the implementations registered *then* (:func:`_compiled`): a
    notification nobody implements becomes a no-op, and the others cost about a plain
    function call. A plugin registered later is not called by this object; build a new
    one (the router builds its own once plugins are configured).

    **Through pluggy** (``through_pluggy=True``, or ``QPID_FLOW_TRACE_HOOKS=1`` in the
    environment): every call goes through ``pm.hook``: plugins registered later are
    called, and pluggy's tracing writes each call and its result to the debug log. For
    debugging: it costs microseconds per call.

    Either way a plugin's exception is logged (``plugin_error``), counted, and answered
    with the safest value (no credit, reject the transfer, let the message wait).
    """

    def __init__(self, pm: pluggy.PluginManager, *, through_pluggy: bool | None = None) -> None:
        self.pm = pm
        if through_pluggy is None:
            through_pluggy = os.environ.get(TRACE_ENVIRONMENT, "") not in ("", "0")
        self.through_pluggy = through_pluggy
        if through_pluggy:
            if pm not in _TRACED:  # once per manager, however many facades are built on it
                _TRACED.add(pm)
                pm.trace.root.setwriter(lambda message: log.debug("hook_trace", call=message.rstrip()))
                pm.enable_tracing()
            return
        for name in hookspecs.hook_names():
            if name in _AT_START:
                continue
            caller = getattr(pm.hook, name)
            if name in _COLLECTED:
                bound = _guarded(caller, _FALLBACKS[name], collect=True)
            elif name in _FALLBACKS:
                bound = _guarded(caller, _FALLBACKS[name])
            else:
                bound = self._notify(caller)
            # Shadows the method of the same name: the method is the typed signature and
            # the through-pluggy path; the instance attribute is the fast one.
            setattr(self, name.removeprefix("qpid_flow_"), bound)

    def _call(self, hook: str, **kwargs: Any) -> Any:
        """Call ``hook`` through pluggy, with the same error handling as the snapshot."""
        try:
            result = getattr(self.pm.hook, hook)(**kwargs)
        except Exception:
            PLUGIN_ERRORS[hook] += 1
            log.exception("plugin_error", hook=hook)
            return _FALLBACKS.get(hook)
        return result

    # --- lifecycle (always through pluggy: called once) ---------------------------------

    def destination_settings(self) -> list[DestinationSetting]:
        """Every key plugins add to destination tables."""
        return [s for group in self.pm.hook.qpid_flow_destination_settings() for s in group]

    def destination_policy_check(self, *, config: RouterConfig, policy: DestinationPolicy, where: str) -> None:
        """Raises ConfigError when a plugin refuses ``policy``."""
        refusable(self.pm.hook.qpid_flow_destination_policy_check)(config=config, policy=policy, where=where)

    def configure(self, *, config: RouterConfig, manager: pluggy.PluginManager | None = None) -> None:
        """Raises ConfigError when a plugin refuses ``config``. ``manager``: this facade's
        plugin manager unless given."""
        refusable(self.pm.hook.qpid_flow_configure)(config=config, manager=manager or self.pm)

    def admin_routes(self) -> list[AdminRoute]:
        """Every route plugins add to the admin endpoint."""
        return [route for routes in self.pm.hook.qpid_flow_admin_routes() for route in routes]

    def started(self, *, control: RouterControl) -> None:
        """Historic: a plugin registered later is called with ``control`` as it registers."""
        try:
            self.pm.hook.qpid_flow_started.call_historic(kwargs={"control": control})
        except Exception:
            PLUGIN_ERRORS["qpid_flow_started"] += 1
            log.exception("plugin_error", hook="qpid_flow_started")

    def stopping(self) -> None:
        self._call("qpid_flow_stopping")

    # --- destinations -------------------------------------------------------------------

    def destination_created(self, *, destination: Destination) -> None:
        self._call("qpid_flow_destination_created", destination=destination)

    def destination_deleted(self, *, destination: Destination) -> None:
        self._call("qpid_flow_destination_deleted", destination=destination)

    def destination_policy_changed(self, *, destination: Destination) -> None:
        self._call("qpid_flow_destination_policy_changed", destination=destination)

    def depth_changed(self, *, destination: Destination) -> None:
        self._call("qpid_flow_depth_changed", destination=destination)

    def flow_changed(self, *, destination: Destination, stopped: bool, limits: dict[str, int]) -> None:
        self._call("qpid_flow_flow_changed", destination=destination, stopped=stopped, limits=limits)

    def destination_stats(self, *, destination: Destination) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self._call("qpid_flow_destination_stats", destination=destination)
        return result

    # --- producers ----------------------------------------------------------------------

    def producer_attached(self, *, producer: Producer, destination: Destination | None) -> None:
        self._call("qpid_flow_producer_attached", producer=producer, destination=destination)

    def producer_credit(self, *, producer: Producer, destination: Destination | None) -> int | None:
        result: int | None = self._call("qpid_flow_producer_credit", producer=producer, destination=destination)
        return result

    def transfer_arrived(self, *, producer: Producer, message: Message, destination: Destination) -> Decision | None:
        result: Decision | None = self._call(
            "qpid_flow_transfer_arrived", producer=producer, message=message, destination=destination
        )
        return result

    def settlement_delay(
        self, *, producer: Producer, message: Message, destination: Destination, settlement: Settlement
    ) -> bool | None:
        result: bool | None = self._call(
            "qpid_flow_settlement_delay",
            producer=producer,
            message=message,
            destination=destination,
            settlement=settlement,
        )
        return result

    def transfer_settled(self, *, producer: Producer, message: Message, settlement: Settlement) -> None:
        self._call("qpid_flow_transfer_settled", producer=producer, message=message, settlement=settlement)

    def producers_held(self, *, destination: Destination) -> bool | None:
        result: bool | None = self._call("qpid_flow_producers_held", destination=destination)
        return result

    def producer_detached(self, *, producer: Producer, destination: Destination | None) -> None:
        self._call("qpid_flow_producer_detached", producer=producer, destination=destination)

    # --- consumers ----------------------------------------------------------------------

    def consumer_attached(self, *, consumer: Consumer, destination: Destination) -> None:
        self._call("qpid_flow_consumer_attached", consumer=consumer, destination=destination)

    def consumer_select(
        self, *, destination: Destination, message: Message, consumers: list[Consumer]
    ) -> Consumer | Hold | None:
        result: Consumer | Hold | None = self._call(
            "qpid_flow_consumer_select", destination=destination, message=message, consumers=consumers
        )
        return result

    def consumer_detached(self, *, consumer: Consumer, destination: Destination) -> None:
        self._call("qpid_flow_consumer_detached", consumer=consumer, destination=destination)

    # --- message groups -----------------------------------------------------------------

    def group_assigned(self, *, destination: Destination, group: str, consumer: Consumer) -> None:
        self._call("qpid_flow_group_assigned", destination=destination, group=group, consumer=consumer)

    def group_released(self, *, destination: Destination, group: str, consumer: Consumer, reason: str) -> None:
        self._call("qpid_flow_group_released", destination=destination, group=group, consumer=consumer, reason=reason)

    # --- messages -----------------------------------------------------------------------

    def message_enqueued(self, *, destination: Destination, message: Message) -> None:
        self._call("qpid_flow_message_enqueued", destination=destination, message=message)

    def message_delivered(self, *, destination: Destination, message: Message, consumer: Consumer) -> None:
        self._call("qpid_flow_message_delivered", destination=destination, message=message, consumer=consumer)

    def message_settled(
        self, *, destination: Destination, message: Message, consumer: Consumer | None, settlement: Settlement
    ) -> None:
        self._call(
            "qpid_flow_message_settled",
            destination=destination,
            message=message,
            consumer=consumer,
            settlement=settlement,
        )

    # --- questions about the plugins themselves -----------------------------------------

    def listens(self, name: str) -> bool:
        """Whether any plugin implements the notification ``name`` (a method above, e.g.
        ``"message_enqueued"``): a caller may skip building what only it would use."""
        return bool(getattr(self.pm.hook, f"qpid_flow_{name}").get_hookimpls())

    def listened(self, *notifications: str) -> bool:
        """Whether some plugin implements one of these notifications."""
        return any(self.listens(name) for name in notifications)

    def asked_before(self, hook: str, plugin: object) -> list[str]:
        """The plugins whose implementation of ``hook`` (its full name) is called before
        ``plugin``'s, by name: none means ``plugin``'s answer is the one that counts."""
        names = []
        for impl in reversed(getattr(self.pm.hook, hook).get_hookimpls()):  # pluggy calls the last first
            if impl.plugin is plugin:
                break
            names.append(impl.plugin_name)
        return names

    @staticmethod
    def _notify(caller: Any) -> Callable[..., Any]:
        if not caller.get_hookimpls():
            return _noop
        return _guarded(caller, None)
