"""Every hook a qpid-flow plugin can implement, and the one source of the hook reference.

The reference in docs/plugins.md is generated from this module (``python -m
qpid_flow.plugin.reference --write docs/plugins.md``): one section per ``# --- ... ---``
banner below, one entry per hook with its exact signature and its docstring. Document a
hook here, never there. House style: the first line says when the hook is called; then
the detail; ``:param name:`` for every argument; ``:return:`` for hooks whose answer is
read; question hooks say "Stops at first non-None result." and what None means.

Hooks run on the reactor thread, once per event: they must be quick and must never
block. Call sites pass keyword arguments, so an implementation may accept fewer
arguments than the specification lists (and specifications can grow).

Naming: ``qpid_flow_<object>_<question>`` hooks answer a question and stop at the
first non-None result (``firstresult``); ``qpid_flow_<object>_<past event>`` hooks
only inform, and every implementation is called.

Built-in behaviour is itself registered as plugins (``qpid_flow.policies``), before any
installed plugin (:mod:`qpid_flow.plugin.manager`). pluggy asks the plugin registered
last first, so an installed plugin answering the same question is asked before the
built-ins; the pass-through policy, which gives the default answers, is moreover
registered ``trylast``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Sequence

    from qpid_flow.config import DestinationPolicy, RouterConfig
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.model import Consumer, Decision, Hold, Message, Producer, Settlement
    from qpid_flow.plugin.control import RouterControl
    from qpid_flow.plugin.declarations import AdminRoute, DestinationSetting

hookspec = pluggy.HookspecMarker("qpid_flow")


# --- Lifecycle hooks -------------------------------------------------------------------


@hookspec
def qpid_flow_destination_settings() -> list[DestinationSetting] | None:
    """Called while the configuration is read, before :func:`qpid_flow_configure`: the keys
    this plugin adds to ``[destinations."..."]`` tables.

    The same keys are accepted in the policies an operator sets at runtime (``qpid-flow
    config add destination``, the admin API). A table holding a key nobody declared is
    refused at start; so is a key or alias declared twice, or one of the core's keys.

    :return: a list of :class:`~qpid_flow.plugin.declarations.DestinationSetting` (key,
        parser, aliases; see "Declarations" below), or None for none. A destination's
        value is then ``destination.policy.setting(key)``.
    """


@hookspec
def qpid_flow_destination_policy_check(config: RouterConfig, policy: DestinationPolicy, where: str) -> None:
    """Called for each ``[destinations."..."]`` table while the configuration is read, and
    for each policy an operator sets at runtime, before it is applied.

    Refuse a value that breaks one of this plugin's rules by raising
    :class:`~qpid_flow.config.ConfigError`: qpid-flow then does not start, or the admin
    API answers 400 and the policy in force stays. The built-in flow control refuses
    ``reject_after`` with a ``limit_policy`` other than ``flow``, and thresholds that
    contradict each other.

    :param config: the configuration (router-wide defaults included).
    :param policy: the table's settings over the router-wide defaults; this plugin's own
        keys are ``policy.setting(key)``.
    :param where: the table's name for the error's key, e.g. ``destinations."orders"``:
        raise ``ConfigError(f"{where}.my_key", value, rule)``.
    """


@hookspec
def qpid_flow_configure(config: RouterConfig, manager: pluggy.PluginManager) -> None:
    """Called once at start, before any connection, with the validated configuration.

    Read this plugin's ``[plugins.NAME]`` table here. Raise
    :class:`~qpid_flow.config.ConfigError` (``ConfigError(key, value, rule)``) to refuse
    the configuration (a setting breaks a rule, a file cannot be written): qpid-flow then
    does not start, and prints the error's one line; the plugins after the one that
    refused are not configured (they would set up for a start that does not come; the
    event log, configured last, would make its files). Any other exception is logged as
    ``plugin_error`` and the start goes on; it keeps no other plugin from being configured.

    :param config: the router configuration; a plugin's own settings are in
        ``config.plugin_settings(name)`` (the ``[plugins.NAME]`` table of the file, empty
        when absent).
    :param manager: the plugin manager. A plugin with nothing to do under this
        configuration may unregister itself (``manager.unregister(self)``): the router
        binds its hooks after this one, so none of that plugin's hooks is then called per
        message.
    """


@hookspec
def qpid_flow_admin_routes() -> list[AdminRoute] | None:
    """Called once at start when the admin endpoint is on (``admin`` in the configuration):
    the routes this plugin answers there.

    The built-in flow control answers ``POST /v1/producers/stop`` and
    ``POST /v1/producers/start`` (what ``qpid-flow producers stop`` sends); message groups
    answer ``GET /v1/groups/{name}``. A route's handler runs on the reactor thread; paths,
    errors and the admin token are described with
    :class:`~qpid_flow.plugin.declarations.AdminRoute` below.

    :return: a list of :class:`~qpid_flow.plugin.declarations.AdminRoute` (None: none). A
        route is refused at start when its method is not GET, PUT, POST or DELETE, when
        its path is not under ``/v1/`` or is under a built-in resource (``health``,
        ``destinations``, ``connections``, ``links``), or when a method and path are
        declared twice.
    """


@hookspec(historic=True)
def qpid_flow_started(control: RouterControl) -> None:
    """Called once when the router is listening, before the destinations named in the
    configuration are created (each with :func:`qpid_flow_destination_created`).

    Historic: a plugin registered after the start (a debugging session adding one to the
    running router's plugin manager) is called with the same ``control`` as it registers.
    Every plugin gets ``control``, whichever of them raises (the exception is logged as
    ``plugin_error``).

    :param control: what a plugin may do to the router later: schedule a timer, hand work
        over from a thread of its own, tell the router that its answers changed
        (``control.wake(address)``), look destinations up (see "The control object"
        below). Keep it.
    """


@hookspec
def qpid_flow_stopping() -> None:
    """Called once when the router begins its shutdown (SIGINT, SIGTERM or SIGHUP).

    From then on no producer gets new credit (:func:`qpid_flow_producer_credit` is no
    longer asked). Stop the plugin's own threads here.
    """


# --- Destination hooks -----------------------------------------------------------------


@hookspec
def qpid_flow_destination_created(destination: Destination) -> None:
    """Called when a destination (an address that producers or consumers use) comes into
    being: the first producer or consumer of an address, or the first anonymous-relay
    transfer to it; a name in the configuration (right after :func:`qpid_flow_started`)
    or one an operator adds at runtime; the temporary queue made for a dynamic source or
    target.

    This is where a plugin sets up what it keeps per destination (in
    ``destination.plugin_state``) or gives the destination a queue of its own
    (``destination.replace_queue(queue)``, as message groups do).

    :param destination: the new destination; its ``policy`` holds the matching
        ``[destinations."..."]`` settings.
    """


@hookspec
def qpid_flow_destination_deleted(destination: Destination) -> None:
    """Called when a destination went away: the temporary queue of a dynamic source or
    target whose link detached, or an auto-created destination that had no producer,
    consumer or message for ``destination_idle_timeout`` (a name in the configuration
    stays).

    Its waiting messages were dropped first (settled as ``qpid-flow:deleted``). Whatever a
    plugin keeps in ``destination.plugin_state`` goes with it; a plugin that keeps state
    elsewhere lets go of it here. A later use of the address creates a new destination.

    :param destination: the destination, no longer in the registry.
    """


@hookspec
def qpid_flow_destination_policy_changed(destination: Destination) -> None:
    """Called when an operator changed the policy in force for ``destination`` at runtime:
    a policy whose name or pattern matches it was added, replaced or removed (``qpid-flow
    config add destination``, the admin API).

    An added or replaced policy passed :func:`qpid_flow_destination_policy_check` first.
    The built-in flow control recomputes its thresholds here and may stop or resume the
    destination at once; message groups install or remove their queue.

    :param destination: the destination; ``destination.policy`` is the new policy.
    """


@hookspec
def qpid_flow_depth_changed(destination: Destination) -> None:
    """Called when the depth counted for ``destination`` (``destination.depth`` messages,
    ``destination.bytes`` bytes) changed.

    A message was counted in (admitted from a producer) or out (accepted or rejected by a
    consumer, dropped from a ring, expired, purged, deleted, refused by the broker), or a
    plugin corrected the depth from the broker (``destination.set_broker_backlog(ready)``).
    Runs twice per message: keep it cheap. The built-in flow control follows its state
    machine here.

    :param destination: the destination; read ``depth`` and ``bytes``.
    """


@hookspec
def qpid_flow_flow_changed(destination: Destination, stopped: bool, limits: dict[str, int]) -> None:
    """Called when producer flow control on ``destination`` turned ON (``stopped``) or OFF.

    Called by the built-in flow-control plugin (through ``control.hooks``), so never while
    it is disabled.

    :param destination: the destination; ``depth`` and ``bytes`` are the values that
        caused the change.
    :param stopped: True when flow turned ON (producers held back), False when it resumed.
    :param limits: the thresholds in force (``flowStopCount``, ``flowResumeCount``,
        ``flowStopSize``, ``flowResumeSize``).
    """


@hookspec
def qpid_flow_destination_stats(destination: Destination) -> dict[str, Any] | None:
    """Called when the destination's statistics record is built (``qpid-flow stat``, the
    admin endpoint, each metrics scrape): the fields this plugin adds to it.

    Every implementation is called and the dicts are merged into the record. If one
    raises, or answers something other than a dict, the record goes without that
    plugin's fields that time. A field of qpid-flow's own (``depth``, ``refused``, ...) is
    never replaced: the plugin's is left out, and logged ``plugin_error``. Two plugins
    giving one field: the one pluggy calls last (registered first, the built-ins, unless
    ``tryfirst``/``trylast`` say otherwise) has the last word; name a plugin's fields
    after it.

    :param destination: the destination.
    :return: a dict of camelCase fields to add, or None.
    """


# --- Producer hooks --------------------------------------------------------------------


@hookspec
def qpid_flow_producer_attached(producer: Producer, destination: Destination | None) -> None:
    """Called when a client attached a producer link, before its first credit is asked.

    In front of a broker, a link to a named address is reported once the broker has
    answered its attach. A link whose address names no single queue because the broker
    routes each message by its subject (RabbitMQ's ``/queue``) is reported as an
    anonymous-relay link is: each transfer counts in the queue its subject names.

    :param producer: the link; ``producer.address`` is None for an anonymous-relay link.
    :param destination: the link's destination, None for an anonymous-relay link.
    """


@hookspec(firstresult=True)
def qpid_flow_producer_credit(producer: Producer, destination: Destination | None) -> int | None:
    """Asked when a producer link may get more credit: how much to **add** now. Stops at
    first non-None result.

    Asked:

    - when the link attaches (in front of a broker, a link to a named address once the
      broker has answered its attach);
    - after one of its transfers is settled back to it, but only once the link holds half
      of its last grant or less (so a link left with no credit is asked after every
      settlement);
    - when a plugin calls ``control.wake(address)``: for every producer of ``address`` and
      every anonymous-relay producer (for every producer when no address is given);
    - in front of a broker, when the broker gives credit to the upstream link of a
      producer to a named address.

    Not asked once shutdown began, nor while the backend refuses producers new credit
    (``Backend.writable``; neither built-in backend does). In front of a broker nothing is
    granted without the broker: a producer to a named address is first asked once the
    broker has answered its attach, is not asked while the credit the broker gave its
    upstream link is all taken (by the credit the client holds and the transfers waiting
    to go up), and is never granted more than the rest (a larger answer is cut down).

    qpid-flow never takes credit back once given (a flow lowering it races with the
    transfers the producer has already sent on it): never grant more than the destination
    may take. The built-in answer (flow control)
    keeps ``producer_window`` messages of credit plus unsettled transfers per link, topped
    up in batches of at least half a window, and less, down to none, near or over the
    destination's stop thresholds, while an operator stopped its producers, or while the
    router is over ``memory_limit``. If a plugin raises, or answers something other than a
    non-negative ``int`` or None (a float, a negative number, a bool), the error is logged
    as ``plugin_error`` and the link gets no credit this time; as a link left with no
    credit would never be asked again, it is asked again a second later, then after twice
    as long each time the policy fails again, up to every 30 seconds (in front of a broker
    too, and sooner if the broker gives its upstream link credit meanwhile).

    :param producer: the link, with the credit it holds (``credit``), its transfers not
        yet settled (``unsettled``) and the credit it held after its last grant
        (``last_grant``).
    :param destination: the link's destination; None for an anonymous-relay link.
    :return: the number of messages of credit to add (an ``int``, 0 for none). None: no
        opinion; if no plugin answers, standalone (and for an anonymous-relay link) the
        router tops the link up to a plain ``producer_window``; in front of a broker a link
        to a named address gets nothing.
    """


@hookspec(firstresult=True)
def qpid_flow_transfer_arrived(producer: Producer, message: Message, destination: Destination) -> Decision | None:
    """Asked when a producer's transfer arrives, before it goes anywhere: what to do with it.
    Stops at first non-None result.

    The answers:

    - :class:`~qpid_flow.core.model.Admit` (``Admit()``): forward it now (to the broker,
      or onto the standalone destination; in a transaction, staged until the commit);
    - :class:`~qpid_flow.core.model.Hold` (``Hold(reason)``): keep it unsettled and
      unforwarded; the producer waits for the outcome. When the answer may have changed,
      call ``control.wake(address)``: the held transfers of the address are asked about
      again, in arrival order, until one is still held (it and those behind it stay
      held). A transfer that arrives while others to its address are held joins the end
      of that line whatever the answer (short of ``Reject``), so that no transfer
      overtakes one held before it. A held transfer whose producer went away is dropped.
      A pre-settled transfer cannot be held back from its producer this way. Held
      transfers are bounded by ``memory_limit``: one that would take them past it is not
      held but rejected (``amqp:resource-limit-exceeded``, "the transfers held
      unforwarded would pass memory_limit");
    - :class:`~qpid_flow.core.model.Reject` (``Reject(description,
      condition="amqp:resource-limit-exceeded")``): settle it ``rejected`` with that
      error condition, forwarding nothing.

    The built-in answer is ``Admit()`` (the pass-through policy); flow control answers
    ``Reject`` or ``Hold`` for a stopped destination whose ``limit_policy`` is ``reject``
    or that has ``reject_after``, and ``Hold`` for a named-target link's transfer past
    stop + 1 or while an operator stopped its producers (credit it held from before). If
    a plugin raises, or answers anything else than these three or None (``False``, say),
    the error is logged as ``plugin_error`` and the transfer is rejected with
    ``amqp:internal-error``.

    :param producer: the link the transfer came on.
    :param message: the message; ``message.address`` is where it goes.
    :param destination: that destination.
    :return: ``Admit()``, ``Hold(reason)`` or ``Reject(...)``. None: no opinion; if no
        plugin answers, the transfer is forwarded as with ``Admit()``.
    """


@hookspec(firstresult=True)
def qpid_flow_settlement_delay(
    producer: Producer, message: Message, destination: Destination, settlement: Settlement
) -> bool | None:
    """Asked when the outcome of a producer's unsettled transfer is known: must telling the
    producer wait? Stops at first non-None result.

    The outcome is the broker's, the standalone destination's, a policy's rejection, or
    in a transaction the acceptance of the staged transfer. This is how flow control
    holds back producers that credit cannot stop per destination, such as anonymous-relay
    links (qpidd's withheld completion): the message is on its destination, and its
    settlement waits until the destination is OFF again. Waiting settlements are asked
    about again, in order, when a plugin calls ``control.wake(address)``: one still
    waiting keeps the later ones of the address waiting behind it. A pre-settled transfer
    has no settlement to delay and is not asked about. If a plugin raises, or answers
    anything but True, False or None, the producer is told now (logged ``plugin_error``).

    :param producer: the link the transfer came on.
    :param message: the message.
    :param destination: its destination.
    :param settlement: the outcome the producer will be given.
    :return: True to keep the producer waiting; False or None (no opinion) to settle now.
    """


@hookspec
def qpid_flow_transfer_settled(producer: Producer, message: Message, settlement: Settlement) -> None:
    """Called when a producer's transfer was settled back to it (after any
    :func:`qpid_flow_settlement_delay`), then its credit may be asked again.

    Also called for a pre-settled transfer once its outcome is known (the producer is told
    nothing); not called when the producer went away first. Called too for a transfer the
    router refuses before any destination or policy sees it (no such destination, not
    allowed, not decodable, no ``to``, no such transaction): then ``message.address`` is
    the address it named, or ``""`` if it named none.

    :param producer: the link the transfer came on.
    :param message: the message.
    :param settlement: the outcome the producer was given (the broker's, the standalone
        destination's, a policy's or the router's rejection, or ``released`` for a held
        transfer whose transaction was rolled back).
    """


@hookspec(firstresult=True)
def qpid_flow_producers_held(destination: Destination) -> bool | None:
    """Asked for each producer link with no credit that ``qpid-flow stat links`` (the admin
    endpoint's links) lists: whether a policy holds the producers of ``destination`` back
    now (the ``blocked`` column). Stops at first non-None result.

    Asked per link listed, not per message. The built-in flow control answers True while
    the destination is stopped, an operator stopped its producers, or the router is over
    ``memory_limit``. If a plugin raises, or answers anything but True, False or None,
    the answer is False (logged ``plugin_error``).

    :param destination: the destination.
    :return: True if its producers wait for the policy, False if not. None: no opinion
        (taken as False).
    """


@hookspec
def qpid_flow_producer_detached(producer: Producer, destination: Destination | None) -> None:
    """Called when a producer link went away (detached, closed, or its connection dropped).

    Its held transfers were dropped (they had never been accepted), and its waiting
    settlements with them. A temporary destination made for its dynamic target is deleted
    right after.

    :param producer: the link.
    :param destination: its destination, None for an anonymous-relay link.
    """


# --- Consumer hooks --------------------------------------------------------------------


@hookspec
def qpid_flow_consumer_attached(consumer: Consumer, destination: Destination) -> None:
    """Called when a client attached a consumer link to ``destination`` (a browser too).

    In front of a broker, only for consumers of a destination qpid-flow hands out itself
    (one with a queue a plugin installed, such as ``shared_groups``): a consumer whose link
    is mirrored to the broker's queue is not reported, though the messages it gets are.

    :param consumer: the link; ``consumer.browser`` for a browser (it gets copies, the
        messages stay).
    :param destination: where it consumes from.
    """


@hookspec(firstresult=True)
def qpid_flow_consumer_select(
    destination: Destination, message: Message, consumers: Sequence[Consumer]
) -> Consumer | Hold | None:
    """Asked for a waiting message when consumers have credit: which consumer gets
    ``message``. Stops at first non-None result.

    Answer one of ``consumers``, or :class:`~qpid_flow.core.model.Hold` (``Hold()``) when
    the message must wait: the destination then looks at the messages behind it (up to a
    bounded look-ahead), so one waiting message never blocks the others, and asks again
    the next time it hands messages out (a consumer gets credit, a message is settled,
    ``control.wake(address)``). On a ``shared_groups`` destination, asked for the first
    message of a free group: the group's other messages go to its owner. Not asked in
    front of a broker for consumers mirrored to the broker's queue.

    The built-in answers: message groups give a free group to the consumer owning the
    fewest groups, then to the one with the most credit; otherwise consumers take turns
    (round robin, the pass-through policy). If a plugin raises, or answers anything but
    one of ``consumers``, a ``Hold`` or None, the message waits, and the destination hands
    messages out again after a pause: 1 s, doubled while the selection keeps failing, up to
    30 s (each failure is logged ``plugin_error``).

    :param destination: where the message waits.
    :param message: the message at hand.
    :param consumers: the consumers of the destination that have credit now and take the
        message (``consumer.takes(message)``: its selector, if any, matches, and the message
        fits in its max-message-size, if any); never empty. A tuple, the plugin's to read
        for this call.
    :return: one of ``consumers``, or a ``Hold`` when the message must wait. None: no
        opinion; if no plugin answers, consumers take turns.
    """


@hookspec
def qpid_flow_consumer_detached(consumer: Consumer, destination: Destination) -> None:
    """Called when a consumer link went away (detached, closed, or its connection dropped).

    Everything it held has already been released back to the front of the destination,
    in original order. In front of a broker, reported for the same consumers as
    :func:`qpid_flow_consumer_attached`.

    :param consumer: the link.
    :param destination: where it consumed from.
    """


# --- Message-group hooks ---------------------------------------------------------------


@hookspec
def qpid_flow_group_assigned(destination: Destination, group: str, consumer: Consumer) -> None:
    """Called when a free message group got an owner (``shared_groups`` destinations): its
    messages go to ``consumer`` until it has settled everything of the group it holds.

    :param destination: the grouped destination.
    :param group: the group id (``default_message_group`` for messages without one).
    :param consumer: the new owner.
    """


@hookspec
def qpid_flow_group_released(destination: Destination, group: str, consumer: Consumer, reason: str) -> None:
    """Called when a message group lost its owner and is free again.

    :param destination: the grouped destination.
    :param group: the group id.
    :param consumer: the owner it had.
    :param reason: ``settled`` (the owner settled all it held), ``detached`` (the owner
        went away; what it held was released back to the front of the group), or
        ``lease`` (the owner held it past ``group_lease``; what it held of the group was
        released).
    """


# --- Message hooks ---------------------------------------------------------------------


@hookspec
def qpid_flow_message_enqueued(destination: Destination, message: Message) -> None:
    """Called when a message entered ``destination``.

    Standalone, from a producer (or a transaction's commit). In front of a broker, when it
    arrives from the broker for a consumer: fetched by qpid-flow's own reader of a
    destination it hands out itself (``shared_groups``), or on a consumer's own mirrored
    link. Runs per message: keep it cheap.

    :param destination: where it is now.
    :param message: the message.
    """


@hookspec
def qpid_flow_message_delivered(destination: Destination, message: Message, consumer: Consumer) -> None:
    """Called when a message was sent to a consumer (a browser's copies are not reported).

    :param destination: where it came from.
    :param message: the message.
    :param consumer: who got it.
    """


@hookspec
def qpid_flow_message_settled(
    destination: Destination,
    message: Message,
    consumer: Consumer | None,
    settlement: Settlement,
) -> None:
    """Called when a consumer settled a message, or the destination let go of it.

    Accepted, rejected and modified undeliverable-here messages have left the destination;
    released and other modified ones are back in it. A message sent to a pre-settled
    consumer is settled accepted as it is sent. The destination lets go of a message
    itself when its consumer went away, at shutdown and when a group lease ran out
    (released back), and when it drops one: expired, dropped from a ring, purged, or
    deleted with its destination (rejected, with a ``qpid-flow:`` condition such as
    ``qpid-flow:ring-dropped``).

    :param destination: the destination.
    :param message: the message.
    :param consumer: who settled it; None when the destination let go of it.
    :param settlement: the outcome.
    """


def hook_names() -> list[str]:
    """The names of every hook above (used to check the hook reference is complete)."""
    return sorted(name for name, value in globals().items() if name.startswith("qpid_flow_") and callable(value))


__all__: list[Any] = ["hook_names", "hookspec"]
