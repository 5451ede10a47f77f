"""One attempt's preemption, as the controller sees it: the notice the train function was
given, the drained Ray nodes, and which ranks report rounds and collectives still wait for.

``FailureConfig.relax_collectives_on_preemption`` narrows the waits to the surviving ranks
(as Ray Train 2.60 narrows its barriers), so the survivors can commit a checkpoint while
the preempted ranks are gone or stuck. :class:`PreemptionState` holds that decision;
``RunCoordinator.relax_for`` applies it to the open rounds and collectives.
"""

from __future__ import annotations

import logging
from typing import Any

from trainer_runtime.checkpoint_manager import CheckpointManager
from trainer_runtime.preemption import PreemptionInfo, combine, merge

logger = logging.getLogger(__name__)


class PreemptionState:
    """The preemption notice of the current worker group and the ranks still required.

    Reset for every worker group (:meth:`begin`): a notice belongs to the group that got
    it; the next group runs elsewhere.
    """

    def __init__(self, manager: CheckpointManager) -> None:
        self._manager = manager
        self.world_size = 1
        #: ``set(range(world_size))``, built once per worker group (not once per report).
        self._everyone: set[int] = {0}
        #: Ray nodes being drained (node id -> deadline ms), kept current by the controller.
        self.drained_nodes: dict[str, int] = {}
        #: The first non-None answer to ``get_preemption_info()``, and the latest committed
        #: checkpoint when it was given (the controller stops once a newer one is committed).
        self.notice: PreemptionInfo | None = None
        self.latest_at_notice: Any = None
        #: ``FailureConfig.relax_collectives_on_preemption`` in effect: the ranks that report
        #: rounds and collectives wait for (the survivors); None: every rank.
        self.required_ranks: set[int] | None = None
        #: The notice the collectives were relaxed for (what answers without them include).
        self.relaxed_notice: PreemptionInfo | None = None

    def begin(self, world_size: int) -> None:
        """A new worker group: no notice, no drained node, every rank required."""
        self.world_size = world_size
        self._everyone = set(range(world_size))
        self.drained_nodes = {}
        self.notice = None
        self.latest_at_notice = None
        self.required_ranks = None
        self.relaxed_notice = None

    def note_drained_nodes(self, nodes: dict[str, int]) -> None:
        """The Ray nodes of this group that are being drained now (node id -> deadline ms)."""
        self.drained_nodes = dict(nodes)

    @property
    def required(self) -> set[int]:
        """The ranks report rounds and collectives wait for (not to be modified)."""
        if self.required_ranks is not None:
            return self.required_ranks
        return self._everyone

    @property
    def relaxed(self) -> bool:
        """Whether rounds and collectives complete without some ranks."""
        return self.required_ranks is not None

    def relax(self, notice: PreemptionInfo) -> list[int] | None:
        """Stop waiting for the ranks ``notice`` names; returns the surviving ranks. None
        (nothing relaxed) when rank 0 is preempted (it writes the metrics and the
        collectives' answers) or no rank survives."""
        surviving = set(range(self.world_size)) - set(notice.preempted_ranks)
        if 0 not in surviving:
            return None
        self.required_ranks = surviving
        self.relaxed_notice = combine(self.relaxed_notice, notice)
        return sorted(surviving)

    def answer(self, gathered: dict[int, Any]) -> PreemptionInfo | None:
        """``get_preemption_info()``'s one answer for every rank: the ranks' own notices
        (SIGTERM) and the drained Ray nodes of this worker group. The first notice given
        is kept (see :meth:`preempted_and_committed`)."""
        info = combine(merge(gathered, self.drained_nodes), self.relaxed_notice)
        if info is not None and self.notice is None:
            self.notice = info
            self.latest_at_notice = self._manager.latest
            logger.warning(
                "Preemption notice for ranks %s (deadline %s ms): the run stops once the next "
                "checkpoint is committed",
                info.preempted_ranks,
                info.deadline_ms,
            )
        return info

    def preempted_and_committed(self) -> bool:
        """Whether the train function was told of a preemption and a checkpoint was
        committed since: the run can stop, nothing is lost."""
        return self.notice is not None and self._manager.latest is not self.latest_at_notice
