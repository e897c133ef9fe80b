"""The bench's report helpers (pure functions; the live scenarios run in the smoke test),
and its vacuuming between rounds."""

import pytest

from bench.live import HOT_TABLES, autovacuum_on, settle, vacuum_hot_tables
from bench.run import median_round


def _round(ratio: float) -> dict:
    return {"engine": {"tasks_per_s": ratio * 1000}, "baseline": {"messages_per_s": 1000.0}, "ratio": ratio}


def test_median_round_reports_the_middle_round_and_every_ratio_in_measured_order():
    assert median_round([_round(0.19), _round(0.12), _round(0.16)]) == {**_round(0.16), "rounds": [0.19, 0.12, 0.16]}


def test_median_round_of_an_even_number_takes_the_lower_middle_round():
    assert median_round([_round(0.2), _round(0.1)])["ratio"] == 0.1
    assert median_round([_round(0.3), _round(0.1), _round(0.4), _round(0.2)])["ratio"] == 0.2


def test_median_round_of_one_round_is_that_round():
    assert median_round([_round(0.25)]) == {**_round(0.25), "rounds": [0.25]}


# --- vacuuming between rounds (needs the database: VACUUM cannot run in a transaction) ---------

def _last_vacuums() -> dict:
    from django.db import connection

    with connection.cursor() as cur:
        # A partitioned table (engine migration 0033) is vacuumed when each of its partitions is.
        cur.execute("SELECT t.name, CASE WHEN bool_and(s.last_vacuum IS NOT NULL) THEN min(s.last_vacuum) END "
                    "FROM unnest(%s::text[]) t(name) "
                    "CROSS JOIN LATERAL (SELECT relid FROM pg_partition_tree(t.name::regclass) WHERE isleaf "
                    "UNION SELECT t.name::regclass WHERE NOT EXISTS (SELECT FROM pg_partition_tree(t.name::regclass))) p "
                    "JOIN pg_stat_user_tables s ON s.relid = p.relid GROUP BY t.name", [list(HOT_TABLES)])
        return dict(cur.fetchall())


@pytest.mark.django_db(transaction=True)
def test_vacuum_hot_tables_vacuums_each_of_the_engine_hot_tables():
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        before = cur.fetchone()[0]
    assert vacuum_hot_tables() >= 0
    after = _last_vacuums()
    assert sorted(after) == sorted(HOT_TABLES)
    assert all(ts is not None and ts >= before for ts in after.values()), after


@pytest.mark.django_db(transaction=True)
def test_settle_vacuums_exactly_when_the_server_autovacuum_is_off():
    from django.db import connection

    with connection.cursor() as cur:
        cur.execute("SELECT now()")
        before = cur.fetchone()[0]
    settle(0)
    vacuumed = [ts is not None and ts >= before for ts in _last_vacuums().values()]
    assert vacuumed == [not autovacuum_on()] * len(HOT_TABLES)


def test_a_smoke_table_does_not_pass_judgement_on_the_targets():
    from bench.run import table

    verdicts = {"throughput_ratio_independent": False, "memory": True}
    meta = {"processes": 2, "threads": 8, "cpus": 2, "load_start": [0.1, 0.1, 0.1]}
    smoke = table({"meta": {**meta, "mode": "smoke"}, "verdicts": verdicts})
    full = table({"meta": {**meta, "mode": "full"}, "verdicts": verdicts})
    assert "targets met" not in smoke and "judged by the full run (make bench)" in smoke
    assert "targets met: throughput_ratio_independent=NO, memory=yes" in full


def test_cpu_per_task_counts_each_process_from_its_own_start_and_never_goes_negative():
    """A CI run's bench smoke read -8.3 ms of PostgreSQL per message: the groups' totals were
    subtracted, and a database backend of another client that ended in between took its
    CPU out of the second total. Per process: one that ended is left out, one that started
    counts whole, a pid reused by a new process (another start time) counts from 0."""
    from bench.live import cpu_ms_per

    before = {"postgres": {(10, 1): 5.0, (11, 1): 2.0, (12, 1): 9.0}, "redis": {(20, 1): 1.0}}
    after = {"postgres": {(10, 1): 5.5, (11, 1): 2.25, (12, 7): 0.25, (13, 8): 0.5}, "redis": {(20, 1): 1.5}}
    # postgres: 0.5 + 0.25 + 0.25 (pid 12 is a new process) + 0.5 (new); 12 at start 1 ended.
    assert cpu_ms_per(before, after, 100) == {"postgres": 15.0, "redis": 5.0}
    assert cpu_ms_per(None, after, 100) is None and cpu_ms_per(before, after, 0) is None
