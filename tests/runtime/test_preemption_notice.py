"""The process's own termination notice (:mod:`trainer_runtime.preemption`): the SIGTERM
handler's deadline combined with notices seen by threads, and the watch on the Ray head that
stops a noticed driver once its cluster is gone."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Iterator

import pytest

from trainer_runtime import preemption


@pytest.fixture(autouse=True)
def no_notice() -> Iterator[None]:
    preemption.clear()
    yield
    preemption.clear()


def test_the_sigterm_notice_and_a_drain_notice_combine_into_the_earliest_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert preemption.local_notice() == (False, None)
    preemption.notify(None)  # a drain without a deadline
    assert preemption.local_notice() == (True, None)
    monkeypatch.setenv(preemption.GRACE_ENV, "30")
    before = time.time()
    preemption._on_sigterm(signal.SIGTERM, None)  # what the handler does with a first SIGTERM
    noticed, deadline_ms = preemption.local_notice()
    assert noticed and deadline_ms is not None
    assert before + 30 - 0.001 <= deadline_ms / 1000 <= time.time() + 30
    preemption.notify(int((before + 5) * 1000))  # an earlier drain deadline wins
    assert preemption.local_notice() == (True, int((before + 5) * 1000))
    stop_at = preemption.driver_stop_time()
    assert stop_at is not None and stop_at < before + 5
    preemption.clear()
    assert preemption.local_notice() == (False, None)


def test_a_head_watch_says_gone_only_after_the_head_stayed_unreachable() -> None:
    gcs = socket.create_server(("127.0.0.1", 0))
    watch = preemption.HeadWatch(f"127.0.0.1:{gcs.getsockname()[1]}", gone_after_s=0.3, poll_s=0.05)
    started = time.monotonic()
    while time.monotonic() - started < 0.5:
        assert not watch.gone()  # it answers
        time.sleep(0.05)
    gcs.close()
    lost = time.monotonic()
    while not watch.gone():
        assert time.monotonic() - lost < 5, "a closed GCS port was never seen as gone"
        time.sleep(0.05)
    assert time.monotonic() - lost >= 0.3
    assert preemption.HeadWatch("no-port", gone_after_s=0.0, poll_s=0.05).gone()
