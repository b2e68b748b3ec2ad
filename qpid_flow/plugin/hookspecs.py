"""Every hook a qpid-flow plugin can implement.

Hooks run on the reactor thread, once per event: they must be quick and must never
block. Call sites pass keyword arguments, so an implementation may accept fewer
arguments than the specification lists (and specifications can grow).

Naming: ``qpid_flow_<object>_<question>`` hooks answer a question and stop at the
first non-None result (``firstresult``); ``qpid_flow_<object>_<past event>`` hooks
only inform, and every implementation is called.

Built-in behaviour is itself registered as plugins (``qpid_flow.policies``), marked
``trylast`` so that an installed plugin answering the same question is asked first.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from qpid_flow.config import RouterConfig
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.model import Consumer, Decision, Hold, Message, Producer, Settlement
    from qpid_flow.plugin.control import RouterControl

hookspec = pluggy.HookspecMarker("qpid_flow")


# --- Lifecycle -------------------------------------------------------------------------


@hookspec
def qpid_flow_configure(config: RouterConfig) -> None:
    """Called once at start, before any connection, with the validated configuration.

    Raise :class:`~qpid_flow.config.ConfigError` to refuse it (a setting breaks a rule, a
    file cannot be written): qpid-flow then does not start, and prints the error's one line.
    Any other exception is logged as ``plugin_error`` and the start goes on.

    :param config: the router configuration; a plugin's own settings are in
        ``config.plugin_settings(name)`` (the ``[plugins.NAME]`` table of the file).
    """


@hookspec
def qpid_flow_started(control: RouterControl) -> None:
    """Called once when the router is listening.

    :param control: what a plugin may do to the router later: schedule a timer, wake a
        destination after a policy change, look destinations up. Keep it.
    """


@hookspec
def qpid_flow_stopping() -> None:
    """Called once when the router begins its shutdown (SIGINT / SIGTERM)."""


# --- Destinations ----------------------------------------------------------------------


@hookspec
def qpid_flow_destination_created(destination: Destination) -> None:
    """A destination (an address that producers or consumers use) came into being.

    :param destination: the new destination; its ``policy`` holds the matching
        ``[destinations."..."]`` settings.
    """


@hookspec
def qpid_flow_destination_deleted(destination: Destination) -> None:
    """A destination went away: a dynamic source's temporary queue whose link detached, or
    an auto-created destination unused for ``destination_idle_timeout``. Its waiting
    messages were dropped first. A later use of the address creates a new destination.

    :param destination: the destination, no longer in the registry.
    """


@hookspec
def qpid_flow_destination_policy_changed(destination: Destination) -> None:
    """An operator changed the policy in force for ``destination`` at runtime.

    :param destination: the destination; ``destination.policy`` is the new policy.
    """


@hookspec
def qpid_flow_depth_changed(destination: Destination) -> None:
    """The depth (messages and bytes) counted for ``destination`` changed.

    Called for every message counted in or out, and when a plugin corrects the depth
    from the broker. Keep it cheap: it runs twice per message.

    :param destination: the destination; read ``depth`` and ``bytes``.
    """


@hookspec
def qpid_flow_flow_changed(destination: Destination, stopped: bool, limits: dict[str, int]) -> None:
    """Producer flow control on ``destination`` turned ON (``stopped``) or OFF.

    :param destination: the destination; ``depth`` and ``bytes`` are the values that
        caused the change.
    :param stopped: True when flow turned ON (producers held back), False when it resumed.
    :param limits: the thresholds in force (``flowStopCount``, ``flowResumeCount``,
        ``flowStopSize``, ``flowResumeSize``).
    """


@hookspec
def qpid_flow_destination_stats(destination: Destination) -> dict[str, Any] | None:
    """Statistics a plugin adds to the destination's record (``qpid-flow stat``).

    :param destination: the destination.
    :return: a dict of camelCase fields to add, or None.
    """


# --- Producers -------------------------------------------------------------------------


@hookspec
def qpid_flow_producer_attached(producer: Producer, destination: Destination | None) -> None:
    """A client attached a producer link.

    :param producer: the link; ``producer.address`` is None for an anonymous-relay link.
    :param destination: the link's destination, None for an anonymous-relay link.
    """


@hookspec(firstresult=True)
def qpid_flow_producer_credit(producer: Producer, destination: Destination | None) -> int | None:
    """How much credit to add to a producer link now. Stops at first non-None result.

    Asked when the link attaches and whenever one of its transfers is settled or a
    destination's state changes. Credit given cannot be taken back: never grant more
    than the destination may take.

    :param producer: the link, with the credit it holds and its unsettled transfers.
    :param destination: the link's destination; None for an anonymous-relay link.
    :return: the number of messages of credit to add (0 for none).
    """


@hookspec(firstresult=True)
def qpid_flow_transfer_arrived(producer: Producer, message: Message, destination: Destination) -> Decision | None:
    """What to do with a transfer a producer sent. Stops at first non-None result.

    :param producer: the link the transfer came on.
    :param message: the message; ``message.address`` is where it goes.
    :param destination: that destination.
    :return: :class:`~qpid_flow.core.model.Admit` to forward it now,
        :class:`~qpid_flow.core.model.Hold` to keep it unsettled until the policy releases
        it with ``control.release_held(...)``, or :class:`~qpid_flow.core.model.Reject` to
        settle it ``rejected`` with the given condition.
    """


@hookspec(firstresult=True)
def qpid_flow_settlement_delay(
    producer: Producer, message: Message, destination: Destination, settlement: Settlement
) -> bool | None:
    """Whether telling the producer its transfer's outcome must wait. Stops at first non-None result.

    Asked when the outcome is known (the broker's or the standalone destination's). This
    is how flow control holds back producers that credit cannot stop, such as
    anonymous-relay links: their settlement waits until every destination of the
    transfer resumes. Asked again, in order, when a plugin calls ``control.wake(address)``.

    :param producer: the link the transfer came on.
    :param message: the message.
    :param destination: its destination.
    :param settlement: the outcome the producer will be given.
    :return: True to keep the producer waiting; False or None to settle now.
    """


@hookspec
def qpid_flow_transfer_settled(producer: Producer, message: Message, settlement: Settlement) -> None:
    """A producer's transfer was settled back to it.

    :param producer: the link the transfer came on.
    :param message: the message.
    :param settlement: the outcome the producer was given (the broker's, the
        standalone destination's, or a policy's rejection).
    """


@hookspec
def qpid_flow_producer_detached(producer: Producer, destination: Destination | None) -> None:
    """A producer link went away (detached, closed, or its connection dropped).

    :param producer: the link.
    :param destination: its destination, None for an anonymous-relay link.
    """


# --- Consumers -------------------------------------------------------------------------


@hookspec
def qpid_flow_consumer_attached(consumer: Consumer, destination: Destination) -> None:
    """A client attached a consumer link to ``destination``.

    :param consumer: the link.
    :param destination: where it consumes from.
    """


@hookspec(firstresult=True)
def qpid_flow_consumer_select(
    destination: Destination, message: Message, consumers: list[Consumer]
) -> Consumer | Hold | None:
    """Which consumer gets ``message``. Stops at first non-None result.

    :param destination: where the message waits.
    :param message: the message at hand.
    :param consumers: the consumers of the destination that have credit now (never
        empty).
    :return: one of ``consumers``; or :class:`~qpid_flow.core.model.Hold` when the message
        must wait (the destination then looks at the messages behind it).
    """


@hookspec
def qpid_flow_consumer_detached(consumer: Consumer, destination: Destination) -> None:
    """A consumer link went away; what it held has been released.

    :param consumer: the link.
    :param destination: where it consumed from.
    """


# --- Message groups --------------------------------------------------------------------


@hookspec
def qpid_flow_group_assigned(destination: Destination, group: str, consumer: Consumer) -> None:
    """A free message group got an owner: its messages go to ``consumer`` until it has
    settled all it holds.

    :param destination: the grouped destination.
    :param group: the group id (the default group for messages without one).
    :param consumer: the new owner.
    """


@hookspec
def qpid_flow_group_released(destination: Destination, group: str, consumer: Consumer, reason: str) -> None:
    """A message group lost its owner and is free again.

    :param destination: the grouped destination.
    :param group: the group id.
    :param consumer: the owner it had.
    :param reason: ``settled`` (the owner settled all it held), ``detached`` (the owner
        went away), or ``lease`` (the owner held it past ``group_lease``).
    """


# --- Messages --------------------------------------------------------------------------


@hookspec
def qpid_flow_message_enqueued(destination: Destination, message: Message) -> None:
    """A message entered ``destination`` (from a producer, or from the broker).

    :param destination: where it is now.
    :param message: the message.
    """


@hookspec
def qpid_flow_message_delivered(destination: Destination, message: Message, consumer: Consumer) -> None:
    """A message was sent to a consumer.

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
    """A consumer settled a message, or the destination let go of it.

    Accepted and rejected messages have left the destination; released and modified
    ones are back in it.

    :param destination: the destination.
    :param message: the message.
    :param consumer: who settled it; None when the router released it (a consumer
        detached, shutdown).
    :param settlement: the outcome.
    """


def hook_names() -> list[str]:
    """The names of every hook above (used to check the hook reference is complete)."""
    return sorted(name for name, value in globals().items() if name.startswith("qpid_flow_") and callable(value))


__all__: list[Any] = ["hook_names", "hookspec"]
