"""``bench.hot_queries.on_index``: which plans count as staying on a hot query's index
(``make bench`` and ``make soak`` judge them; a soak failed on the run-progress query's plan
taking the other seed index that leads with ``workflow_run_id``)."""

from bench.hot_queries import QUERIES, on_index


def test_run_progress_may_probe_either_seed_index_on_the_run():
    spec = QUERIES["run_progress"]
    assert on_index(spec, ["idx_taskrun_run_state"])
    assert on_index(spec, ["uniq_taskrun_per_run_task"])
    # A scan by anything else is not its index (the primary key, the state index).
    assert not on_index(spec, ["core_taskrun_pkey"])
    assert not on_index(spec, ["idx_taskrun_state_age"])
    assert not on_index(spec, [])


def test_the_other_hot_queries_accept_their_seed_index_only():
    assert on_index(QUERIES["claim"], ["idx_taskrun_ready_claim"])
    assert not on_index(QUERIES["claim"], ["uniq_taskrun_per_run_task"])
    assert on_index(QUERIES["lease_reaper"], ["idx_taskrun_lease_expiry"])
    assert not on_index(QUERIES["lease_reaper"], ["idx_taskrun_running_org"])
    assert on_index(QUERIES["outbox_drain"], ["idx_outbox_pending"])


def test_the_soak_accepts_the_other_running_index_for_the_reaper_only_with_nothing_running():
    from bench.soak import _drained_reaper

    assert _drained_reaper("lease_reaper", ["idx_taskrun_running_org"], running=0)
    assert not _drained_reaper("lease_reaper", ["idx_taskrun_running_org"], running=1)
    assert not _drained_reaper("lease_reaper", ["idx_taskrun_state_age"], running=0)
    assert not _drained_reaper("claim", ["idx_taskrun_running_org"], running=0)
