"""What ranks ask the controller and wait for: collectives, ``get_all_reported_checkpoints()``
and upload claims (see ``RequestEvent``), and the check that no rank waits for a rank whose
train function already returned."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainer_runtime._events import RequestEvent
from trainer_runtime._preemption_state import PreemptionState
from trainer_runtime._rounds import RoundTracker
from trainer_runtime.checkpoint_manager import CheckpointManager
from trainer_runtime.errors import UserConfigError
from trainer_runtime.preemption import PREEMPTION_CALLER

#: Sends an answer to a rank: ``reply(rank, request_id, value)`` (see ``RequestEvent``).
Reply = Callable[[int, int, Any], None]


@dataclass
class _Query:
    """A rank waiting in ``get_all_reported_checkpoints()``."""

    rank: int
    request_id: int
    #: Rounds below this one must be processed (the rank reported them).
    until_round: int
    validated: bool
    deadline: float | None


@dataclass
class _Collective:
    """Ranks inside one collective call (by sequence number)."""

    caller: str
    arrived: dict[int, int] = field(default_factory=dict)  # rank -> request id
    data: Any = None
    gathered: dict[int, Any] = field(default_factory=dict)  # rank -> its data


class WorkerRequests:
    """Answers the ranks' requests of one worker group at a time.

    ``rounds`` tells which rounds are processed (queries wait for them) and takes upload
    claims; ``preemption`` tells which ranks a collective waits for and answers
    ``get_preemption_info()``.
    """

    def __init__(
        self, manager: CheckpointManager, rounds: RoundTracker, preemption: PreemptionState
    ) -> None:
        self._manager = manager
        self._rounds = rounds
        self._preemption = preemption
        self.world_size = 1
        #: How answers reach this worker group's ranks (None between attempts).
        self._reply: Reply | None = None
        self._queries: list[_Query] = []
        self._collectives: dict[int, _Collective] = {}
        self._finished: set[int] = set()
        #: Collectives answered without some ranks (seq -> answer), for those arriving late.
        self._answered: dict[int, Any] = {}

    def begin(self, world_size: int, reply: Reply | None) -> None:
        """A new worker group, answered through ``reply``."""
        self.world_size = world_size
        self._reply = reply
        self._queries.clear()
        self._collectives.clear()
        self._finished.clear()
        self._answered.clear()

    def end(self) -> None:
        """The worker group is gone: nothing can be answered any more."""
        self._reply = None

    def _send(self, rank: int, request_id: int, value: Any) -> None:
        if self._reply is None:
            raise UserConfigError(
                f"rank {rank} waits for the controller, but this run cannot answer workers"
            )
        self._reply(rank, request_id, value)

    def on_request(self, event: RequestEvent) -> None:
        """A rank asks and waits for the answer."""
        if event.kind == "collective":
            seq, caller, data = event.payload
            if seq in self._answered:  # answered without this rank (relaxed collectives)
                self._send(event.rank, event.request_id, self._answered[seq])
                return
            collective = self._collectives.setdefault(seq, _Collective(caller))
            collective.arrived[event.rank] = event.request_id
            if event.rank == 0:
                collective.data = data
            collective.gathered[event.rank] = data
            if not self._answer_collective(seq):
                self._check_stranded()
        elif event.kind == "reported_checkpoints":
            until_round, mode, timeout_s = event.payload
            deadline = None if timeout_s is None else time.monotonic() + float(timeout_s)
            self._queries.append(
                _Query(event.rank, event.request_id, until_round, mode == "VALIDATED", deadline)
            )
            self.answer_queries()
            self._check_stranded()
        elif event.kind == "upload_claim":
            self._send(event.rank, event.request_id, self._rounds.claim(event.rank, event.payload))
        else:  # pragma: no cover - the session sends only the kinds above
            raise UserConfigError(f"unknown request {event.kind!r} from rank {event.rank}")

    def on_finished(self, rank: int) -> None:
        """``rank``'s train function returned."""
        self._finished.add(rank)
        self._check_stranded()

    def answer_collectives(self) -> None:
        """Answer every collective whose required ranks are all in it (after relaxing)."""
        for seq in sorted(self._collectives):
            self._answer_collective(seq)

    def _answer_collective(self, seq: int) -> bool:
        """Answer collective ``seq`` if every required rank is in it; whether it was."""
        collective = self._collectives[seq]
        required = self._preemption.required
        # The count first: the set comparison only once enough ranks arrived.
        if len(collective.arrived) < len(required) or not required <= collective.arrived.keys():
            return False
        del self._collectives[seq]
        answer = collective.data
        if collective.caller == PREEMPTION_CALLER:
            answer = self._preemption.answer(collective.gathered)
        if len(collective.arrived) < self.world_size:
            self._answered[seq] = answer
        for rank, request_id in sorted(collective.arrived.items()):
            self._send(rank, request_id, answer)
        return True

    def answer_queries(self, now: float | None = None) -> None:
        """Answer the ``get_all_reported_checkpoints()`` calls whose wait is over (their
        rounds processed and, for ``VALIDATED``, no validation pending; or their
        ``timeout_s`` passed)."""
        if not self._queries:
            return
        pending_validation = any(r.status.is_pending for r in self._manager.records)
        waiting: list[_Query] = []
        answer: list[Any] | None = None
        for query in self._queries:
            ready = self._rounds.cursor >= query.until_round and not (
                query.validated and pending_validation
            )
            timed_out = query.deadline is not None and (now or time.monotonic()) >= query.deadline
            if not (ready or timed_out):
                waiting.append(query)
                continue
            if answer is None:
                answer = self._manager.reported_checkpoints()
            self._send(query.rank, query.request_id, answer)
        self._queries = waiting

    def _check_stranded(self) -> None:
        """Fail the attempt when ranks wait for a rank whose train function already returned:
        in a collective it never joins, or for rounds it never reports."""
        if not self._finished:
            return
        for collective in self._collectives.values():
            missing = sorted(set(range(self.world_size)) - set(collective.arrived))
            done = sorted(set(missing) & self._finished)
            if done:
                raise UserConfigError(
                    f"ranks {sorted(collective.arrived)} wait in {collective.caller}() but the "
                    f"train function of rank(s) {done} returned without calling it; every rank "
                    "must call the same collectives in the same order"
                )
        for query in self._queries:
            short = sorted(
                rank
                for rank in self._finished
                if self._rounds.offset + self._rounds.report_counts.get(rank, 0) < query.until_round
            )
            if short:
                raise UserConfigError(
                    f"rank {query.rank} waits in get_all_reported_checkpoints() for report "
                    f"rounds that rank(s) {short} never reported (their train function "
                    "returned); every rank must call report() the same number of times"
                )
