"""Shared message groups (Qpid C++ broker / Broker-J SHARED_GROUPS): the group table and dispatch.

Plain Python, no Proton. A :class:`GroupedQueue` replaces a destination's FIFO queue
when the destination has ``shared_groups = true``:

- at any moment the unsettled messages of one group are out to at most one consumer,
  its owner, which may hold up to its credit of them;
- once the owner has settled everything of the group it held, the group is free and its
  next message may go to any consumer;
- groups never block each other: every group whose head can go now (free, or owned by a
  consumer with credit) sits in a heap ordered by the position of its head in the
  queue, so the oldest message that can go goes first and a group waiting for its owner
  costs nothing until that owner has credit again;
- released messages return to the front of their group, in their original order;
- a group with no message and no owner is forgotten: memory follows the groups in use;
- a consumer with a selector takes only messages it matches: a free group's head goes to a
  ready consumer that matches it, and an owned group's head that its owner's selector does
  not match waits until the owner settles the group;
- a free group's head that every ready consumer refuses (selector, max-message-size) or
  that only barred consumers could take is parked out of the heap, with the consumers that
  refused it: it costs nothing more until its group's head changes, a consumer gets credit
  again (attaching, or from none to some) or a bar lifts. Each consumer has a mark, the
  last park it was ready for: it refused every head parked up to there, so getting credit
  again re-offers only what was parked since (as :class:`FifoQueue` keeps a cursor per
  consumer with a filter);
- ring drops and purges take the oldest waiting message from an index of the groups'
  heads by sequence, built on the first such call: O(log n), not a scan of every group.
"""

from __future__ import annotations

import bisect
import heapq
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from qpid_flow.core.model import DEFAULT_GROUP, Consumer, Hold, Message, group_key

if TYPE_CHECKING:
    from qpid_flow.core.destination import Destination
    from qpid_flow.core.queues import Select, Send

__all__ = ["DEFAULT_GROUP", "GroupedQueue", "group_key"]

_SHRINK_AFTER = 1024

# Stale entries (a group's old head, a forgotten group) pile up in the heads heaps when no
# dispatch pops them (ring drops or expiry with no consumer credit): every so many pushes or
# forgotten groups, a heap longer than twice the groups plus this is rebuilt from the live
# entries. The check runs once per (number of groups + this) such events, so the rebuild,
# linear in the heap, costs O(1) per event.
_TRIM_SLACK = 64

# (event, group id, consumer) -> None; event: "assigned", a release reason ("settled",
# "detached", "lease"), or "out_of_order"
GroupEvents = Callable[[str, str, Consumer], None]


def _sequence_of(message: Message) -> int:
    return message.sequence


def _is_head(sequence: int, group: _Group) -> bool:
    """Whether a (sequence, group) pair is the group's current head."""
    messages = group.messages
    return bool(messages) and messages[0].sequence == sequence


def _may_go(sequence: int, group: _Group) -> bool:
    """Whether a pair in the dispatch heap is live: the current head, and not parked."""
    return not group.parked and _is_head(sequence, group)


class _Heads:
    """The heads that may go now, as (sequence, group) pairs, smallest sequence first.

    The pair holds the group itself, not its key: dispatch then goes from a head to its
    group without a lookup in a table of 100,000 groups (a cache miss or two per message).

    A min-heap would do, but a head is nearly always offered with a larger sequence than
    any offered before it (messages arrive in order, and a group's next head comes after
    the one that just went): those go on the back of a deque, which stays sorted, at O(1)
    both ways. Only the rest (released messages, an owner's groups offered again when it
    has credit, choices put back) pay for the heap. With 100,000 groups every message
    starts a group, so this is one push and one pop per message.
    """

    __slots__ = ("_heap", "_ordered")

    def __init__(self) -> None:
        self._ordered: deque[tuple[int, Any]] = deque()
        self._heap: list[tuple[int, Any]] = []

    def __bool__(self) -> bool:
        return bool(self._ordered or self._heap)

    def __len__(self) -> int:
        return len(self._ordered) + len(self._heap)

    def push(self, sequence: int, group: Any) -> None:
        ordered = self._ordered
        if not ordered or sequence > ordered[-1][0]:
            ordered.append((sequence, group))
        else:
            heapq.heappush(self._heap, (sequence, group))

    def first(self) -> tuple[int, Any]:
        """The smallest pair (there must be one)."""
        ordered, heap = self._ordered, self._heap
        if not heap or (ordered and ordered[0] < heap[0]):
            return ordered[0]
        return heap[0]

    def pop(self) -> None:
        """Drop the smallest pair."""
        ordered, heap = self._ordered, self._heap
        if not heap or (ordered and ordered[0] < heap[0]):
            ordered.popleft()
        else:
            heapq.heappop(heap)

    def keep(self, valid: Callable[[int, Any], bool]) -> None:
        """Keep only the pairs ``valid`` accepts, one per group (a group offered twice with
        the same head has two). In place: dispatch may be walking this very object."""
        seen: set[int] = set()

        def wanted(pair: tuple[int, Any]) -> bool:
            sequence, group = pair
            if id(group) in seen or not valid(sequence, group):
                return False
            seen.add(id(group))
            return True

        self._ordered = deque(pair for pair in self._ordered if wanted(pair))
        heap = [pair for pair in self._heap if wanted(pair)]
        heapq.heapify(heap)
        self._heap = heap

    def clear(self) -> None:
        self._ordered = deque()
        self._heap = []

    @classmethod
    def of_sorted(cls, pairs: list[tuple[int, Any]]) -> _Heads:
        """Heads from pairs already sorted by sequence (they stay in the deque: O(1) pops)."""
        heads = cls()
        heads._ordered = deque(pairs)
        return heads


class _Group:
    """A group's waiting messages (in queue order), owner and what the owner holds.

    ``messages`` is a tuple while the group has at most one message waiting and a deque
    once it has more: with 100,000 groups nearly every group has one, and a deque costs
    about 600 bytes, most of the group table's memory and of the cache misses in walking it.
    """

    __slots__ = ("acquired_at", "held", "key", "messages", "owner", "parked", "refused")

    def __init__(self, key: str) -> None:
        self.key = key
        self.messages: tuple[Message, ...] | deque[Message] = ()
        self.owner: Consumer | None = None
        self.held = 0  # messages of this group the owner holds unsettled
        self.acquired_at = 0.0  # when the owner took it or last settled one of it (lease)
        # Ids of the consumers whose selector or max-message-size refuses the head: that never
        # changes for a (consumer, message) pair, so it is not asked again. Reset with the head.
        self.refused: tuple[int, ...] = ()
        self.parked = 0  # its key in GroupedQueue._parked while parked, else 0

    def __lt__(self, other: _Group) -> bool:
        # Two heads compare their groups only when their sequences are equal: a stale
        # entry and a live one for the same message (re-offered, or requeued into a group
        # made anew). Either may come first; the stale one is skipped.
        return False

    def push(self, message: Message) -> None:
        """Add ``message`` at the back."""
        messages = self.messages
        if type(messages) is tuple:
            if not messages:
                self.messages = (message,)
                return
            messages = self.messages = deque(messages)
        messages.append(message)  # type: ignore[union-attr]

    def pop_first(self) -> Message:
        """Take the first waiting message (there must be one)."""
        messages = self.messages
        if type(messages) is tuple:
            self.messages = ()
            return messages[0]
        return messages.popleft()  # type: ignore[union-attr]

    def editable(self) -> deque[Message]:
        """The waiting messages as a deque, for edits in place (releases: rare)."""
        if type(self.messages) is tuple:
            self.messages = deque(self.messages)
        return self.messages  # type: ignore[return-value]


def _owner(consumer: Consumer) -> str:
    """A group's owner as operators name it: connection/link (``c3/orders-worker-1``), the
    connection as ``qpid-flow stat connections`` and ``connection close`` know it."""
    link = consumer.name or str(consumer.id)
    return f"{consumer.connection_id}/{link}" if consumer.connection_id else link


class GroupedQueue:
    """A destination's waiting messages, dispatched by shared-group rules."""

    def __init__(
        self,
        header: str | None,
        select: Select,
        default_group: str = DEFAULT_GROUP,
        clock: Callable[[], float] | None = None,
        on_event: GroupEvents | None = None,
        ownership_events: bool = True,
        sole_consumer_takes_free_groups: bool = False,
    ) -> None:
        self.header = header  # None: properties.group-id; else an application property
        self.default_group = default_group
        self._select = select
        self._clock = clock or (lambda: 0.0)
        self._on_event = on_event or (lambda _event, _group, _consumer: None)
        # Whether assignments and releases are reported (out-of-order always is): with
        # 100,000 groups there are two per message, and no one may be listening.
        self._ownership_events = ownership_events and on_event is not None
        # True when the groups plugin's chooser is asked first: with one consumer ready
        # it would name that consumer, so a free group goes to it without the call (with
        # 100,000 groups, one per message).
        self._sole_consumer_takes_free_groups = sole_consumer_takes_free_groups
        self._groups: dict[str, _Group] = {}
        self._heads = _Heads()  # heads that may go now (lazily pruned: stale ones are skipped)
        self._owned: dict[int, set[str]] = {}  # consumer id -> groups it owns
        # Consumer that lost a group to its lease -> until when it gets no free group
        # (:meth:`bar`): a stuck consumer owning the fewest groups would win it straight back.
        self._barred: dict[Consumer, float] = {}
        self._waiting = 0
        self._release_reason = "settled"
        self._peak_groups = 0
        # Free groups whose head no ready consumer takes, by park number (dict order is
        # park order); out of the heads heap until something changes (see the module doc).
        self._parked: dict[int, _Group] = {}
        self._parks = 0  # park numbers handed out
        # Consumer id -> the park number when it was last ready in a dispatch: it refused
        # (or was barred from) every head parked up to there.
        self._ready_mark: dict[int, int] = {}
        # Every waiting group's head by sequence, for pop_oldest (ring drops, purge): None
        # until the first call, so a destination that never drops pays nothing for it.
        self._oldest: _Heads | None = None
        self._until_trim = _TRIM_SLACK  # pushes or forgotten groups until the next _trim

    # --- what is in it ------------------------------------------------------------------

    def group_of(self, message: Message) -> str:
        # No (or an unreadable) group id: the default group.
        return group_key(message.group_id(self.header), self.default_group)

    def __len__(self) -> int:
        return self._waiting

    def __iter__(self) -> Iterator[Message]:
        return iter(sorted((m for g in self._groups.values() for m in g.messages), key=_sequence_of))

    @property
    def group_count(self) -> int:
        return len(self._groups)

    def owned_by(self, consumer: Consumer) -> int:
        """How many groups ``consumer`` owns now."""
        return len(self._owned.get(consumer.id, ()))

    def describe(self) -> list[dict[str, Any]]:
        """Each group with its owner, messages held and waiting (like qpidd's group state)."""
        return [
            {
                "group": g.key,
                "owner": _owner(g.owner) if g.owner is not None else None,
                "ownerId": g.owner.id if g.owner is not None else None,
                "held": g.held,
                "waiting": len(g.messages),
            }
            for g in sorted(self._groups.values(), key=lambda g: g.key)
        ]

    # --- messages in and out ------------------------------------------------------------

    def _offer(self, group: _Group) -> None:
        """The group's head may be able to go now: put it in the heap."""
        if group.messages and (group.owner is None or group.owner.credit > 0):
            self._heads.push(group.messages[0].sequence, group)
            self._until_trim -= 1
            if self._until_trim <= 0:
                self._trim()

    def _head_changed(self, group: _Group) -> None:
        """The group's first waiting message is another one (or there is none): what was
        known of the old head no longer holds, and the new one is offered."""
        group.refused = ()
        if group.parked:
            del self._parked[group.parked]
            group.parked = 0
        if group.messages:
            if self._oldest is not None:
                self._oldest.push(group.messages[0].sequence, group)
            self._offer(group)

    def _park(self, group: _Group) -> None:
        self._parks += 1
        group.parked = self._parks
        self._parked[self._parks] = group

    def _unpark_where(self, wanted: Callable[[_Group], bool], after: int = 0) -> None:
        """Put back in the heap the parked groups parked after park ``after`` that ``wanted``
        accepts (newest first: only those are looked at)."""
        parked = self._parked
        back: list[int] = []
        for number in reversed(parked):
            if number <= after:
                break
            if wanted(parked[number]):
                back.append(number)
        for number in back:
            group = parked.pop(number)
            group.parked = 0
            self._heads.push(group.messages[0].sequence, group)

    def _trim(self) -> None:
        """Drop the stale entries of the heads heaps if there are many (see _TRIM_SLACK)."""
        groups = len(self._groups)
        limit = 2 * groups + _TRIM_SLACK
        if len(self._heads) > limit:
            self._heads.keep(_may_go)
        if self._oldest is not None and len(self._oldest) > limit:
            self._oldest.keep(_is_head)
        self._until_trim = groups + _TRIM_SLACK

    def _forget_if_idle(self, group: _Group) -> None:
        if not group.messages and group.owner is None:
            del self._groups[group.key]
            if not self._groups and self._peak_groups > _SHRINK_AFTER:
                # A dict keeps its largest size: start afresh once a crowd of groups is gone.
                # (The heads are cleared in place: a dispatch may be walking them.)
                self._groups = {}
                self._parked = {}
                self._heads.clear()
                self._oldest = None
                self._peak_groups = 0
                self._until_trim = _TRIM_SLACK
                return
            # Its entries in the heads heaps are stale now: they count towards a trim.
            self._until_trim -= 1
            if self._until_trim <= 0:
                self._trim()

    def _group(self, key: str) -> _Group:
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(key)
            if len(self._groups) > self._peak_groups:
                self._peak_groups = len(self._groups)
        return group

    def append(self, message: Message) -> None:
        group = self._group(self.group_of(message))
        group.push(message)
        self._waiting += 1
        if len(group.messages) == 1:
            # A new head (_head_changed, inlined: once per message with many short groups;
            # a group with no message is neither parked nor refused by anyone).
            if self._oldest is not None:
                self._oldest.push(message.sequence, group)
            self._offer(group)

    def requeue(self, message: Message) -> None:
        group = self._group(self.group_of(message))
        messages = group.editable()
        self._waiting += 1
        if not messages or message.sequence < messages[0].sequence:
            messages.appendleft(message)
            self._head_changed(group)
        else:
            messages.insert(bisect.bisect_left(messages, message.sequence, key=_sequence_of), message)

    def pop_oldest(self) -> Message | None:
        oldest = self._oldest
        if oldest is None:
            # Built on the first ring drop or purge, then kept up as heads change.
            oldest = self._oldest = _Heads.of_sorted(
                sorted((g.messages[0].sequence, g) for g in self._groups.values() if g.messages)
            )
        while oldest:
            sequence, group = oldest.first()
            oldest.pop()
            if group.messages and group.messages[0].sequence == sequence:
                break
        else:
            return None
        message = group.pop_first()
        self._waiting -= 1
        self._head_changed(group)
        self._forget_if_idle(group)
        return message

    def remove_where(self, predicate: Callable[[Message], bool]) -> list[Message]:
        gone: list[Message] = []
        for group in [g for g in self._groups.values() if g.messages]:
            messages = group.messages
            before = len(gone)
            kept: list[Message] = []
            for message in messages:
                (gone if predicate(message) else kept).append(message)
            if len(gone) == before:
                continue
            head_changed = not kept or kept[0] is not messages[0]
            group.messages = tuple(kept) if len(kept) <= 1 else deque(kept)
            if head_changed:
                self._head_changed(group)
            self._forget_if_idle(group)
        self._waiting -= len(gone)
        if gone:
            self._trim()  # expiry with no consumer credit: nothing else would pop the stale heads
        return gone

    # --- dispatch -------------------------------------------------------------------------

    def dispatch(self, destination: Destination, ready: list[Consumer], send: Send) -> None:
        heads = self._heads
        barred = self._barred
        if barred:
            self._lift_bars()
        choosy: bool | None = None  # whether a ready consumer filters: found when needed
        marks = self._ready_mark
        held_back: list[tuple[int, _Group]] = []
        while heads and ready:
            sequence, group = heads.first()
            messages = group.messages
            if not messages or messages[0].sequence != sequence or group.parked:
                # Stale: the group moved on, or went away (a forgotten group has no
                # messages, and one made anew for its key is offered on its own), or it
                # is parked (a second entry for the same head).
                heads.pop()
                continue
            owner = group.owner
            if owner is not None:
                heads.pop()
                if owner.credit <= 0:
                    continue  # offered again when the owner has credit (consumer_ready)
                if owner.choosy and not owner.takes(messages[0]):
                    # Not for the owner (its selector, or too large for it): it waits until
                    # the owner has settled the group, which frees it for a consumer that
                    # takes it (released).
                    continue
                consumer = owner
            else:
                takers = [c for c in ready if c not in barred] if barred else ready
                if self._sole_consumer_takes_free_groups and len(takers) == 1 and not takers[0].choosy:
                    heads.pop()
                    consumer = takers[0]  # takes everything: no selector to run
                else:
                    if choosy is None:
                        # Found once per dispatch (ready only shrinks); not before, as with
                        # one consumer ready and none filtering it would cost every message.
                        choosy = False
                        for taker in ready:
                            if taker.choosy:
                                choosy = True
                                break
                    if choosy:
                        takers = self._takers(group, takers)
                    heads.pop()
                    if not takers:
                        # Every ready consumer refuses it, or is barred: parked, it is not
                        # looked at again on every dispatch (the module doc says what
                        # re-offers it).
                        self._park(group)
                        continue
                    if choosy:
                        # ``taking``: the consumers that take it, not to be filtered again.
                        choice = self._select(
                            destination=destination, message=messages[0], consumers=takers, taking=True
                        )
                    else:
                        choice = self._select(destination=destination, message=messages[0], consumers=takers)
                    if choice is None or isinstance(choice, Hold):
                        # A plugin's reason, whose end this queue cannot see: asked next time.
                        held_back.append((sequence, group))
                        continue
                    consumer = choice
                group.owner = consumer
                group.acquired_at = self._clock()
                owned = self._owned.get(consumer.id)
                if owned is None:
                    owned = self._owned[consumer.id] = set()
                owned.add(group.key)
                if self._ownership_events:
                    self._on_event("assigned", group.key, consumer)
            message = group.pop_first()
            message.queue_handle = group
            self._waiting -= 1
            group.held += 1
            send(consumer, message)
            # The group's head changed (_head_changed, inlined: once per message; the group
            # was not parked, it was just taken from the heap).
            group.refused = ()
            if group.messages:
                if self._oldest is not None:
                    self._oldest.push(group.messages[0].sequence, group)
                self._offer(group)
            if consumer.credit <= 0 and consumer in ready:
                if self._parks:
                    marks[consumer.id] = self._parks
                ready.remove(consumer)
        if self._parks:  # (with nothing ever parked, every mark is 0 anyway)
            # Every head parked so far was refused by (or barred from) these consumers.
            for consumer in ready:
                marks[consumer.id] = self._parks
        for entry in held_back:
            heads.push(*entry)

    def _takers(self, group: _Group, consumers: list[Consumer]) -> list[Consumer]:
        """The ``consumers`` that take the group's head; those that refuse it are noted on
        the group, so that their selector is not run on it again."""
        head = group.messages[0]
        refused = group.refused
        takers: list[Consumer] = []
        for consumer in consumers:
            if consumer.choosy:
                if consumer.id in refused:
                    continue
                if not consumer.takes(head):
                    refused += (consumer.id,)
                    continue
            takers.append(consumer)
        group.refused = refused
        return takers

    def adopt(self, consumer: Consumer, message: Message) -> None:
        """``consumer`` already holds ``message`` (grouping switched on at runtime)."""
        key = self.group_of(message)
        group = self._group(key)
        if group.owner is None:
            group.owner = consumer
            group.acquired_at = self._clock()
            self._owned.setdefault(consumer.id, set()).add(key)
        if group.owner is consumer:
            group.held += 1
            message.queue_handle = group
        else:
            # Another consumer owns the group; a note left by an earlier queue must not count.
            message.queue_handle = None

    def consumer_ready(self, consumer: Consumer) -> None:
        """``consumer`` has credit again (or has just attached): its groups' heads may go,
        and so may the heads parked while it had none that it has not refused."""
        for key in self._owned.get(consumer.id, ()):
            group = self._groups.get(key)
            if group is not None:
                self._offer(group)
        if self._parked:
            consumer_id = consumer.id
            self._unpark_where(lambda g: consumer_id not in g.refused, self._ready_mark.get(consumer_id, 0))

    # --- settlement -----------------------------------------------------------------------

    def released(self, consumer: Consumer, message: Message, removed: bool = False) -> None:
        # The group the message went out in (dispatch and adopt note it): no lookup of its
        # key in the group table, which with 100,000 groups is a cache miss or two.
        group = message.queue_handle
        message.queue_handle = None
        if group is None:
            group = self._groups.get(self.group_of(message))
        if group is None or group.owner is not consumer:
            return
        key = group.key
        if removed and group.messages and group.messages[0].sequence < message.sequence:
            # Seed 001's caveat: an earlier message of the group was released and waits
            # again while this one is done. Allowed; worth knowing.
            self._on_event("out_of_order", key, consumer)
        group.held -= 1
        group.acquired_at = self._clock()
        if group.held > 0:
            return
        # The owner settled all it held: the group is free for any consumer.
        group.owner = None
        owned = self._owned.get(consumer.id)
        if owned is not None:
            # Kept when empty (dropped in consumer_gone): with many short groups the owner
            # would otherwise get a new set for nearly every message.
            owned.discard(key)
        if self._ownership_events:
            self._on_event(self._release_reason, key, consumer)
        if group.messages:
            self._offer(group)
        else:
            self._forget_if_idle(group)

    def release_reason(self, reason: str) -> GroupedQueue:
        """Name the reason for the group releases that follow (``lease``); reset after use."""
        self._release_reason = reason
        return self

    def __enter__(self) -> GroupedQueue:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._release_reason = "settled"

    def consumer_gone(self, consumer: Consumer) -> None:
        self._barred.pop(consumer, None)
        self._ready_mark.pop(consumer.id, None)
        for key in self._owned.pop(consumer.id, set()):
            group = self._groups.get(key)
            if group is not None and group.owner is consumer:
                group.owner = None
                group.held = 0
                if self._ownership_events:
                    self._on_event("detached", key, consumer)
                self._offer(group)
                self._forget_if_idle(group)

    def bar(self, consumer: Consumer, until: float) -> None:
        """``consumer`` lost a group to its lease: no free group goes to it before ``until``
        (on the clock given), so that the group goes to another consumer, or waits."""
        self._barred[consumer] = until

    def _lift_bars(self) -> None:
        """End the bars that are over; the heads parked meanwhile that a consumer no longer
        barred has not refused may go to it (a lease expiry is rare: all are looked at)."""
        now = self._clock()
        lifted = [c.id for c, until in self._barred.items() if until <= now]
        if not lifted:
            return
        for consumer in [c for c in self._barred if c.id in lifted]:
            del self._barred[consumer]
        if self._parked:
            self._unpark_where(lambda g: any(i not in g.refused for i in lifted))

    def expired(self, lease: float, now: float) -> list[tuple[Consumer, str]]:
        """(owner, group) pairs whose owner held the group past ``lease`` without settling."""
        return [
            (g.owner, g.key)
            for g in self._groups.values()
            if g.owner is not None and g.held > 0 and now - g.acquired_at > lease
        ]
