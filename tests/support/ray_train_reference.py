"""``ray.train`` 2.60 as the reference the compatibility tests run beside ``trainer_runtime``.

:func:`prompt_cleaner_stop` is the one setting the tests change in it, and why.
"""

from __future__ import annotations

#: How often Ray Train's placement-group cleaner checks its controller, and how long it waits
#: on Ray's state API for the answer (Ray's defaults: 1.0 and 10).
CLEANER_CHECK_INTERVAL_S = 0.1
CLEANER_GET_ACTOR_TIMEOUT_S = 1


def prompt_cleaner_stop() -> None:
    """Make each ``ray.train`` ``fit()`` end about 10 seconds sooner, as it does on a cluster.

    Ray Train V2 starts a detached ``PlacementGroupCleaner`` actor per run (it removes the
    run's placement group if the controller dies) and, when the run ends, waits for it to stop:
    up to ``2 * check_interval + get_actor_timeout`` seconds, 12 with Ray's defaults. The
    cleaner's monitor thread sits in a state-API call (``get_actor``) that, on the tests'
    dashboard-less local clusters, answers only at its 10-second timeout, so every ``fit()``
    spent about 10 idle seconds at its end (21 s against 10.5 s for a two-worker fit that
    reports once; measured 2026-12-07). The cleaner's job, its protocol and everything the
    tests compare are unchanged: only its polling interval and state-API timeout are shorter.
    Call it before a ``ray.train`` trainer is built (the callback is created in the trainer's
    constructor, with these values as its defaults); idempotent.
    """
    from ray.train.v2._internal.callbacks.placement_group_callback import (
        PlacementGroupCleanerCallback,
    )

    PlacementGroupCleanerCallback.__init__.__defaults__ = (
        CLEANER_CHECK_INTERVAL_S,
        CLEANER_GET_ACTOR_TIMEOUT_S,
        None,  # stop_timeout: derived from the two above, as Ray derives it
    )
