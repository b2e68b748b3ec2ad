"""Build the plugin manager and the typed facade the data path calls hooks through.

Registration order (pluggy asks the last registered first, so an installed plugin is
asked before the built-ins; only the pass-through policy is also ``trylast``): built-ins,
then plugins from the ``qpid_flow`` entry-point group, then the plugins named in
``$QPID_FLOW_PLUGINS``. Any of them can be disabled by name
(``disable_plugins`` in the configuration, ``--disable-plugin`` or
``$QPID_FLOW_DISABLE_PLUGINS``).

A plugin that raises never takes the router down, nor keeps the other plugins from being
called: each implementation is called under its own guard, the error is logged naming the
plugin, and a question hook falls back to the safest answer (no credit, reject the
transfer, let the message wait). So does a question answered with a value of the wrong
type.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import os
import types
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import pluggy
import structlog

from qpid_flow.config import MAX_CREDIT, ConfigError
from qpid_flow.core.model import SELECT_AFTER_FAILURE, Admit, Hold, Reject

if TYPE_CHECKING:
    from qpid_flow.config import DestinationPolicy, RouterConfig
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.model import Consumer, Decision, Message, Producer, Settlement
    from qpid_flow.plugin.control import RouterControl
    from qpid_flow.plugin.declarations import AdminRoute, DestinationSetting
from qpid_flow.plugin import hookspecs

__all__ = [
    "BUILTIN_PLUGINS",
    "CREDIT_AFTER_FAILURE",
    "PLUGINS_WITHOUT_SETTINGS",
    "PLUGIN_ERRORS",
    "Hooks",
    "build_plugin_manager",
    "check_names_to_disable",
    "disabled_in_environment",
    "disabled_plugins",
    "known_plugin_names",
    "load_plugin",
    "loaded_plugins",
    "module_plugin",
    "require_hooks",
]

log = structlog.get_logger(__name__)

# Exceptions plugins raised and answers of the wrong type they gave, by hook
# (qpid_flow_plugin_errors_total): counted on the error path only, read by the metrics at
# scrape time.
PLUGIN_ERRORS: Counter[str] = Counter()

ENTRY_POINT_GROUP = "qpid_flow"
PLUGINS_ENVIRONMENT = "QPID_FLOW_PLUGINS"
DISABLE_ENVIRONMENT = "QPID_FLOW_DISABLE_PLUGINS"

# name -> module; each module's ``Plugin()`` is registered (its methods carry @hookimpl).
BUILTIN_PLUGINS: dict[str, str] = {
    "passthrough": "qpid_flow.policies.passthrough",
    "flow": "qpid_flow.policies.flow_control.plugin",
    "groups": "qpid_flow.policies.groups.plugin",
    "events": "qpid_flow.policies.event_log.plugin",
}


# qpid-flow's own plugins read no ``[plugins.NAME]`` table: their settings are router keys
# (top level) and destination keys (declared with qpid_flow_destination_settings). A key
# in such a table would never be read (config.build_config refuses it).
PLUGINS_WITHOUT_SETTINGS: frozenset[str] = frozenset(BUILTIN_PLUGINS)


def _names_from_env(variable: str) -> list[str]:
    return [name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()]


def disabled_in_environment() -> list[str]:
    """The names ``$QPID_FLOW_DISABLE_PLUGINS`` disables."""
    return _names_from_env(DISABLE_ENVIRONMENT)


def known_plugin_names() -> list[str]:
    """Every name a plugin has on this machine, sorted: the built-ins, the entry points of
    the ``qpid_flow`` group installed, and the entries of ``$QPID_FLOW_PLUGINS``."""
    from importlib.metadata import entry_points  # only here: scanning what is installed takes a while

    installed = {entry_point.name for entry_point in entry_points(group=ENTRY_POINT_GROUP)}
    return sorted({*BUILTIN_PLUGINS, *installed, *_names_from_env(PLUGINS_ENVIRONMENT)})


def check_names_to_disable(names: Iterable[str], key: str, value: Any) -> None:
    """Raises ConfigError (``key`` = ``value``) when a name to disable names no plugin of
    :func:`known_plugin_names`. Such a name disabled nothing: ``--disable-plugin flw`` left
    flow control on, silently. A plugin not installed on this machine is not loaded
    anyway: its name is refused too, so that a typo can never pass for it."""
    names = list(names)
    if not names:
        return
    known = known_plugin_names()
    unknown = [name for name in names if name not in known]
    if unknown:
        raise ConfigError(key, value, f"{unknown[0]!r} names no plugin; known: {', '.join(known)}")


def build_plugin_manager(disabled: Iterable[str] = (), *, installed: bool = True) -> pluggy.PluginManager:
    """A plugin manager with every hook, the built-ins, and (``installed``) the plugins of
    the entry-point group and of ``$QPID_FLOW_PLUGINS``.

    Raises ConfigError (qpid-flow does not start, and prints its one line) when an installed
    plugin implements no hook: it was most likely loaded wrong, and would do nothing."""
    pm = pluggy.PluginManager("qpid_flow")
    pm.add_hookspecs(hookspecs)
    blocked = set(disabled) | set(disabled_in_environment())
    for name in blocked:
        pm.set_blocked(name)
    for name, module_name in BUILTIN_PLUGINS.items():
        if name not in blocked:
            pm.register(importlib.import_module(module_name).Plugin(), name=name)
    entry_points_key = f"[project.entry-points.{ENTRY_POINT_GROUP}]"
    if installed:
        with refused_as(entry_points_key, pm):
            pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
        for plugin, distribution in pm.list_plugin_distinfo():
            require_hooks(pm, plugin, f"{entry_points_key} of {distribution.project_name}")
        for spec in _names_from_env(PLUGINS_ENVIRONMENT):
            if spec not in blocked and pm.get_plugin(spec) is None:
                plugin = load_plugin(spec, pm)
                with refused_as(PLUGINS_ENVIRONMENT, pm):
                    pm.register(plugin, name=spec)
                require_hooks(pm, plugin, PLUGINS_ENVIRONMENT)
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        from_environment = pm.get_name(exc.plugin) in _names_from_env(PLUGINS_ENVIRONMENT)
        raise _refusal(PLUGINS_ENVIRONMENT if from_environment else entry_points_key, pm, exc) from exc
    return pm


@contextlib.contextmanager
def refused_as(key: str, pm: pluggy.PluginManager) -> Iterator[None]:
    """A plugin pluggy refuses (a hook or argument name misspelt: ``qpid_flow_transfer_arived``,
    ``def qpid_flow_transfer_arrived(self, msg)``) stops the start with one line naming it
    (ConfigError: ``key``, the plugin, pluggy's reason), not a traceback; a test that loads
    it with make_hooks gets the same."""
    try:
        yield
    except pluggy.PluginValidationError as exc:
        raise _refusal(key, pm, exc) from exc


def _refusal(key: str, pm: pluggy.PluginManager, exc: pluggy.PluginValidationError) -> ConfigError:
    name = pm.get_name(exc.plugin) if pm.is_registered(exc.plugin) else None
    reason = " ".join(str(exc).split())
    return ConfigError(key, name or getattr(exc.plugin, "__name__", repr(exc.plugin)), reason)


def load_plugin(spec: str, pm: pluggy.PluginManager) -> object:
    """The plugin an entry of ``$QPID_FLOW_PLUGINS`` names: ``module:attribute`` is that
    object (as an entry point names one); a bare ``module`` is its ``plugin`` object when that
    implements a hook (the layout docs/plugins.md shows, hooks as methods of ``plugin =
    Plugin()``), else the module itself (hooks as module functions)."""
    module_name, _, attribute = spec.partition(":")
    # A name that imports nothing (a typo, a module off the path) or a module that fails as
    # it is imported is a configuration error: one line naming the variable, exit 2, not a
    # traceback. The error's own text says which (No module named 'x', a SyntaxError, ...).
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        reason = " ".join(str(exc).split())  # one line, whatever the module raised
        raise ConfigError(PLUGINS_ENVIRONMENT, spec, f"cannot be imported: {type(exc).__name__}: {reason}") from exc
    if attribute:
        try:
            return functools.reduce(getattr, attribute.split("."), module)
        except AttributeError as exc:
            raise ConfigError(PLUGINS_ENVIRONMENT, spec, f"module {module_name} has no {attribute}") from exc
    return module_plugin(module, pm)


def module_plugin(module: types.ModuleType, pm: pluggy.PluginManager) -> object:
    """What to register for ``module``: its ``plugin`` object when that implements a hook,
    else the module itself."""
    plugin = getattr(module, "plugin", None)
    return plugin if plugin is not None and _hook_names(pm, plugin) else module


def _hook_names(pm: pluggy.PluginManager, plugin: object) -> list[str]:
    """The hooks ``plugin`` implements (its attributes carrying ``@hookimpl``), as pluggy finds them."""
    return [name for name in dir(plugin) if pm.parse_hookimpl_opts(plugin, name) is not None]


def require_hooks(pm: pluggy.PluginManager, plugin: object, where: str) -> None:
    """Raises ConfigError (``where`` is its key) when ``plugin``, registered, implements no hook."""
    if not pm.get_hookcallers(plugin):
        name = pm.get_name(plugin)
        rule = "implements no qpid_flow hook (nothing in it carries @hookimpl); name the object that does: MODULE:NAME"
        raise ConfigError(where, name, rule)


def loaded_plugins(pm: pluggy.PluginManager) -> list[str]:
    """The names of the plugins registered, sorted."""
    # pluggy lists a blocked name too, with None for its plugin (even one that never existed).
    return sorted(name for name, plugin in pm.list_name_plugin() if plugin is not None)


def disabled_plugins(pm: pluggy.PluginManager) -> list[str]:
    """The names disabled (blocked), sorted: built-ins and plugins left out. A name that
    matches nothing is listed too (pluggy blocks any name); qpid-flow's configuration
    refuses one before it gets here (:func:`check_names_to_disable`)."""
    return sorted(name for name, plugin in pm.list_name_plugin() if plugin is None)


# --- what a failing plugin costs: its own answer, never the others' ---------------------------


class _NoCredit(int):
    """An int that is 0: see :data:`CREDIT_AFTER_FAILURE`."""

    __slots__ = ()


# What qpid_flow_producer_credit answers when a plugin failed (raised, or answered something
# that is not a credit): no credit, as 0 is, but told apart from a plugin's own 0 by
# identity (``credit is CREDIT_AFTER_FAILURE``): a link with no credit sends nothing, so
# nothing would ask for its credit again; the router asks again later.
CREDIT_AFTER_FAILURE: Final[int] = _NoCredit(0)


class _AnswerRule(NamedTuple):
    """What a question hook's non-None answer (or each answer a collected notification
    returns) must be: the data path relies on it."""

    valid: Callable[..., bool]  # the answer, then the hook's ``arguments``
    expected: str  # for the log
    # When the answer is valid if and only if it is an instance of one of these: the
    # compiled caller checks it inline (a function call costs more, once per message).
    types: tuple[type, ...] = ()
    # The hook's arguments ``valid`` also takes, after the answer: an answer valid only
    # among what the hook was given (one of the consumers offered).
    arguments: tuple[str, ...] = ()


def _is_decision(answer: Any) -> bool:
    return isinstance(answer, (Admit, Hold, Reject))


def _is_credit(answer: Any, producer: Producer) -> bool:
    # bool is an int, but True is no credit anyone meant; a float or a negative number is
    # refused by Proton (the connection closes) or by the client, and so is credit past
    # AMQP's 2^31 - 1 with what the link holds (or it wraps round to a negative credit).
    if not isinstance(answer, int) or isinstance(answer, bool):
        return False
    return 0 <= answer <= MAX_CREDIT - max(producer.credit, 0)


def _is_selection(answer: Any, consumers: Sequence[Consumer]) -> bool:
    # The very consumer offered (identity: one detached since, or merely equal, is not),
    # or a Hold. Once per message handed out: a plain loop, no generator.
    for consumer in consumers:
        if consumer is answer:
            return True
    return isinstance(answer, Hold)


def _is_flag(answer: Any) -> bool:
    return isinstance(answer, bool)


def _is_record(answer: Any) -> bool:
    """Fields for a destination's statistics: a mapping the admin endpoint can send as
    JSON (text keys; a set, a datetime or bytes would fail every read of the
    destinations). Asked per statistics read, not per message."""
    if not isinstance(answer, Mapping) or not all(isinstance(key, str) for key in answer):
        return False
    try:
        json.dumps(dict(answer), allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


_ANSWER_RULES: dict[str, _AnswerRule] = {
    "qpid_flow_transfer_arrived": _AnswerRule(
        _is_decision, "Admit(), Hold(...), Reject(...) or None", (Admit, Hold, Reject)
    ),
    "qpid_flow_producer_credit": _AnswerRule(
        _is_credit, "a non-negative int or None, with the link's credit at most 2^31 - 1", arguments=("producer",)
    ),
    "qpid_flow_consumer_select": _AnswerRule(
        _is_selection, "one of the consumers offered, Hold(...) or None", arguments=("consumers",)
    ),
    # True or False: anything else (Admit(), Hold(), "yes") was taken by its truth, and a
    # producer kept waiting for good on an answer meant otherwise, with nothing logged.
    "qpid_flow_settlement_delay": _AnswerRule(_is_flag, "True, False or None", (bool,)),
    "qpid_flow_producers_held": _AnswerRule(_is_flag, "True, False or None", (bool,)),
    # Collected: a wrong answer is left out of the statistics record, the others' are kept.
    "qpid_flow_destination_stats": _AnswerRule(_is_record, "a dict of JSON values with str keys, or None"),
}


def _plugin_raised(hook: str, plugin: str | None, error: BaseException | None = None) -> None:
    """Log and count an exception of ``plugin``'s implementation of ``hook`` (the one being
    handled, unless ``error`` is given)."""
    PLUGIN_ERRORS[hook] += 1
    log.error("plugin_error", hook=hook, plugin=plugin, exc_info=error or True)


def _plugin_answered_wrong(hook: str, plugin: str | None, answer: Any) -> None:
    PLUGIN_ERRORS[hook] += 1
    expected = _ANSWER_RULES[hook].expected
    log.error(
        "plugin_error", hook=hook, plugin=plugin, answer=repr(answer), error=f"answered {answer!r}: not {expected}"
    )


# --- the fast callers: compiled for the implementations registered -----------------------------


def _caller_source(
    spec_args: tuple[str, ...], impl_args: list[tuple[str, ...]], mode: str, check: str | None = None
) -> str:
    """The text of a caller taking the hook's arguments by keyword and calling each
    implementation (``f0``, ``f1``, ... in pluggy's order) with the ones it names, each under
    its own ``try`` (free in CPython 3.11 until something raises): one plugin's exception
    never keeps the others from being called.

    ``mode``: ``"first"`` (the first non-None answer, else None; an implementation that
    raises ends the call with ``failed(i)``, the safest answer), ``"collect"`` (the list of
    non-None answers) or ``"notify"`` (nothing). ``check``: an expression of ``result`` (and
    of the hook's arguments); a first answer is returned only if it holds, else
    ``refused(i, result)``; a collected answer is kept only if it holds, else left out
    with ``refused(i, result)``."""
    lines = [f"def call(*, {', '.join(spec_args)}):" if spec_args else "def call():"]
    if mode == "collect":
        lines.append("    results = []")
    for index, args in enumerate(impl_args):
        invocation = f"f{index}({', '.join(args)})"
        lines += ["    try:", f"        result = {invocation}" if mode != "notify" else f"        {invocation}"]
        lines.append("    except Exception:")
        if mode == "first":
            answer = f"result if {check} else refused({index}, result)" if check else "result"
            lines += [f"        return failed({index})", "    if result is not None:", f"        return {answer}"]
        elif mode == "collect":
            lines += [f"        failed({index})", "    else:", "        if result is not None:"]
            if check:
                lines += [f"            if {check}:", "                results.append(result)"]
                lines += ["            else:", f"                refused({index}, result)"]
            else:
                lines.append("            results.append(result)")
        else:
            lines.append(f"        failed({index})")
    lines.append("    return results" if mode == "collect" else "    return None")
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
    hook = caller.name
    names = [impl.plugin_name for impl in impls]
    rule = _ANSWER_RULES.get(hook) if mode != "notify" else None

    def failed(index: int) -> Any:
        _plugin_raised(hook, names[index])
        return fallback

    def refused(index: int, answer: Any) -> Any:
        _plugin_answered_wrong(hook, names[index], answer)
        return fallback

    namespace: dict[str, Any] = {"failed": failed, "refused": refused}
    namespace.update({f"f{index}": impl.function for index, impl in enumerate(impls)})
    check = None
    if rule is not None:
        namespace.update(valid=rule.valid, answer_types=rule.types)
        check = "isinstance(result, answer_types)" if rule.types else f"valid({', '.join(('result', *rule.arguments))})"
    source = _caller_source(tuple(caller.spec.argnames), [tuple(impl.argnames) for impl in impls], mode, check)
    exec(compile(source, f"<qpid_flow hook caller {hook}>", "exec"), namespace)
    function: Callable[..., Any] = namespace["call"]
    return function


def _mode(caller: Any) -> str:
    """How a hook's answers are read: the first (a question), all of them (the notifications
    whose answers are read), none."""
    if caller.spec is not None and caller.spec.opts.get("firstresult"):
        return "first"
    return "collect" if caller.name in _COLLECTED else "notify"


def _guarded(caller: Any, fallback: Any) -> Callable[..., Any]:
    """The caller of a hook: compiled (:func:`_compiled`) unless an implementation is a
    wrapper, then through pluggy (:class:`_ThroughPluggy`); either way each implementation
    is called under its own guard, and a question answered wrong or by a plugin that raised
    gets ``fallback``."""
    mode = _mode(caller)
    return _compiled(caller, mode, fallback) or _ThroughPluggy(caller, mode, fallback)


# --- through pluggy: its wrappers, its order, its tracing, and a guard per implementation ------


def _execute(caller: Any, impls: Sequence[pluggy.HookImpl], kwargs: dict[str, Any], firstresult: bool) -> Any:
    """Call ``impls`` (``caller``'s, some replaced by guarded copies) as pluggy calls a hook:
    with pluggy's own executor, the one ``HookCaller.__call__`` runs, so wrappers, order and
    tracing (``QPID_FLOW_TRACE_HOOKS``) are pluggy's."""
    return caller._hookexec(caller.name, list(impls), kwargs, firstresult)


def _shielded(
    impl: pluggy.HookImpl,
    hook: str,
    fallback: Any,
    rule: _AnswerRule | None = None,
    refusals: list[ConfigError] | None = None,
) -> pluggy.HookImpl:
    """A copy of ``impl`` that never raises: an exception is logged and counted, naming the
    plugin, and answered ``fallback`` (None lets pluggy go on to the next implementation; a
    question's safest answer ends the call with it). An answer ``rule`` refuses is handled
    the same way. ``refusals``: a ConfigError is kept there instead (the start-up hooks
    that may refuse the configuration). A wrapper is left as it is: it wraps the others'
    calls, only the whole call can be guarded."""
    if impl.wrapper or impl.hookwrapper:
        return impl
    function = impl.function
    plugin = impl.plugin_name
    # The rule's arguments come after the implementation's own (pluggy passes them: see
    # below), for the rule only.
    arity = len(impl.argnames) if rule is not None and rule.arguments else None

    @functools.wraps(function)  # pluggy reads the arguments to pass from the wrapped function
    def shielded(*args: Any) -> Any:
        if refusals:
            # A plugin refused the configuration: qpid-flow will not start, and those after
            # it set nothing up for nothing (the event log's writer, last, makes its files).
            return fallback
        own = args if arity is None else args[:arity]
        try:
            answer = function(*own)
        except Exception as exc:
            if refusals is not None and isinstance(exc, ConfigError):
                refusals.append(exc)
            else:
                _plugin_raised(hook, plugin)
            return fallback
        if answer is not None and rule is not None and not rule.valid(answer, *args[len(own) :]):
            _plugin_answered_wrong(hook, plugin, answer)
            return fallback
        return answer

    shield = pluggy.HookImpl(impl.plugin, plugin, shielded, impl.opts)
    if rule is not None and rule.arguments:
        # pluggy passes each implementation the arguments named here, in this order.
        setattr(shield, "argnames", (*impl.argnames, *rule.arguments))  # noqa: B010 (Final in pluggy's types)
    return shield


def _culprit(error: BaseException, impls: Iterable[pluggy.HookImpl]) -> str | None:
    """The plugin whose implementation raised ``error``: the innermost on its traceback."""
    plugins = {_code_of(impl.function): impl.plugin_name for impl in impls}
    culprit = None
    frame = error.__traceback__
    while frame is not None:
        culprit = plugins.get(frame.tb_frame.f_code, culprit)
        frame = frame.tb_next
    return culprit


def _code_of(function: Any) -> Any:
    function = inspect.unwrap(getattr(function, "__func__", function))
    return getattr(function, "__code__", None)


class _ThroughPluggy:
    """Calls one hook through pluggy, the implementations registered at each call, each
    under its own guard (:func:`_shielded`): for the debugging mode and for hooks a wrapper
    implements."""

    def __init__(self, caller: Any, mode: str, fallback: Any) -> None:
        self._caller = caller
        self._mode = mode
        self._fallback = fallback
        self._shields: dict[pluggy.HookImpl, pluggy.HookImpl] = {}  # each implementation's guarded copy

    def __call__(self, **kwargs: Any) -> Any:
        hook = self._caller.name
        impls = self._caller.get_hookimpls()
        try:
            answer = _execute(self._caller, [self._shield(impl) for impl in impls], kwargs, self._mode == "first")
        except Exception as exc:  # a wrapper's: every other implementation is guarded
            _plugin_raised(hook, _culprit(exc, impls))
            return self._fallback
        if self._mode == "notify":
            return None
        rule = _ANSWER_RULES.get(hook)
        if rule is None or answer is None:
            return answer
        # Each implementation's answer was checked: a wrapper replaced it.
        arguments = [kwargs[name] for name in rule.arguments]
        if self._mode == "first":
            if rule.valid(answer, *arguments):
                return answer
            _plugin_answered_wrong(hook, _wrappers(impls), answer)
            return self._fallback
        kept: list[Any] = []
        for one in answer if isinstance(answer, list) else [answer]:
            if one is None:
                continue
            if rule.valid(one, *arguments):
                kept.append(one)
            else:
                _plugin_answered_wrong(hook, _wrappers(impls), one)
        return kept

    def _shield(self, impl: pluggy.HookImpl) -> pluggy.HookImpl:
        shield = self._shields.get(impl)
        if shield is None:
            hook = self._caller.name
            # A notification's fallback is None: pluggy goes on to the next implementation
            # (a collected answer refused is left out).
            fallback = self._fallback if self._mode == "first" else None
            shield = _shielded(impl, hook, fallback, _ANSWER_RULES.get(hook))
            self._shields[impl] = shield
        return shield


def _wrappers(impls: Iterable[pluggy.HookImpl]) -> str:
    """The plugins wrapping a call (one of them replaced an answer)."""
    return ", ".join(impl.plugin_name for impl in impls if impl.wrapper or impl.hookwrapper)


def refusable(caller: Any) -> Callable[..., None]:
    """The caller of a start-up hook whose implementations may refuse the configuration:
    each implementation is called under its own guard, until one raises a
    :class:`~qpid_flow.config.ConfigError`; that one goes on to the caller (qpid-flow does
    not start and prints its one line). Any other exception is logged and counted like any
    hook's: it keeps neither the others from being called nor qpid-flow from starting."""

    def call(**kwargs: Any) -> None:
        refusals: list[ConfigError] = []
        impls = caller.get_hookimpls()
        try:
            _execute(caller, [_shielded(impl, caller.name, None, refusals=refusals) for impl in impls], kwargs, False)
        except ConfigError:
            raise
        except Exception as exc:  # a wrapper's
            _plugin_raised(caller.name, _culprit(exc, impls))
        if refusals:
            raise refusals[0]

    return call


_CONTAINED: weakref.WeakSet[pluggy.PluginManager] = weakref.WeakSet()


def _contain_late_started(pm: pluggy.PluginManager) -> None:
    """qpid_flow_started is historic: pluggy calls a plugin registered after the start with
    it as it registers the plugin, outside any guard of ours; an exception there would leave
    the plugin half registered and reach whoever registers it. Contained like any hook's
    (each such call is one plugin's)."""
    if pm in _CONTAINED:
        return
    _CONTAINED.add(pm)

    def after(outcome: pluggy.Result[Any], hook: str, impls: Sequence[pluggy.HookImpl], _kwargs: Any) -> None:
        if hook == "qpid_flow_started" and outcome.exception is not None:
            _plugin_raised(hook, _culprit(outcome.exception, impls), outcome.exception)
            outcome.force_result([])

    pm.add_hookcall_monitoring(lambda *_args: None, after)


def _noop(**_kwargs: Any) -> None:
    return None


# What a question hook answers when an implementation raises or answers wrong (the safest
# answer), and a statistics record without plugins' fields.
_FALLBACKS: dict[str, Any] = {
    "qpid_flow_producer_credit": CREDIT_AFTER_FAILURE,
    "qpid_flow_transfer_arrived": Reject("a qpid-flow policy failed on this transfer", condition="amqp:internal-error"),
    "qpid_flow_settlement_delay": False,
    "qpid_flow_consumer_select": SELECT_AFTER_FAILURE,
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
        self._through: dict[str, _ThroughPluggy] = {}  # by hook, made on first use
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
            bound = _guarded(caller, _FALLBACKS[name]) if name in _FALLBACKS else self._notify(caller)
            # Shadows the method of the same name: the method is the typed signature and
            # the through-pluggy path; the instance attribute is the fast one.
            setattr(self, name.removeprefix("qpid_flow_"), bound)

    def _call(self, hook: str, **kwargs: Any) -> Any:
        """Call ``hook`` through pluggy, with the same error handling as the snapshot."""
        through = self._through.get(hook)
        if through is None:
            caller = getattr(self.pm.hook, hook)
            through = self._through[hook] = _ThroughPluggy(caller, _mode(caller), _FALLBACKS.get(hook))
        return through(**kwargs)

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
        """Historic: a plugin registered later is called with ``control`` as it registers.

        Every plugin gets ``control`` whichever of them raises: flow control, for one, can
        resume the producers it stopped only through it."""
        hook = "qpid_flow_started"
        caller = self.pm.hook.qpid_flow_started
        _contain_late_started(self.pm)
        # pluggy keeps ``control`` for the plugins registered later without calling anyone
        # here (a caller that leaves every present plugin out); those are called below, each
        # under its own guard, which pluggy's historic call would not give them.
        present = [impl.plugin for impl in caller.get_hookimpls()]
        self.pm.subset_hook_caller(hook, remove_plugins=present).call_historic(kwargs={"control": control})
        _ThroughPluggy(caller, "notify", None)(control=control)

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
        self, *, destination: Destination, message: Message, consumers: Sequence[Consumer]
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
