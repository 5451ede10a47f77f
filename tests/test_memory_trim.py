"""The operator gives a burst's freed memory back once quiet, once per period of work."""

from __future__ import annotations

from trainjob_operator.memory_trim import QuietTrimmer, give_memory_back


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_trims_once_after_work_stopped_for_the_quiet_period() -> None:
    clock, work, trims = _Clock(), [0], [0]

    def trim() -> None:
        trims[0] += 1

    trimmer = QuietTrimmer(lambda: work[0], quiet_s=30, trim=trim, clock=clock)
    clock.now = 100
    assert not trimmer.check()  # no work since it started: nothing to give back
    for second in range(100, 160, 10):  # a burst: reconciles every check
        clock.now, work[0] = second, work[0] + 5
        assert not trimmer.check()
    clock.now = 170
    assert not trimmer.check()  # quiet for 10 s only
    clock.now = 185
    assert trimmer.check() and trims == [1]  # quiet for 35 s: trimmed
    clock.now = 400
    assert not trimmer.check() and trims == [1]  # still quiet: not again
    work[0] += 1  # a reconcile (a timer tick)
    clock.now = 401
    assert not trimmer.check()
    clock.now = 440
    assert trimmer.check() and trims == [2]


def test_giving_memory_back_runs_here() -> None:
    give_memory_back()  # gc.collect() and, with glibc, malloc_trim(0): no error
