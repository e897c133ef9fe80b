"""The history tables' partitions (issue 21; engine.partitions, migration 0033): created ahead
on a database that already holds rows, by two managers at once, across a period boundary;
dropped whole once no run of their period is kept; and seed 001's unique-index trap."""

from __future__ import annotations

import datetime as dt
import threading

import pytest
from django.db import connection, connections

from engine import partitions, retention
from engine.models import TaskLog, TaskRunEvent, WorkflowRun
from engine.repositories import events
from tenancy.models import Organization
from tests.unit.test_notifications import finished_run
from tests.unit.test_retention import age, decorate, offload_dir  # noqa: F401 (a fixture)

DAY = dt.timedelta(days=1)


def partition_of(table: str, **where) -> set[str]:
    """The partitions the rows of ``table`` matching ``where`` (column = value) are stored in."""
    clause = " AND ".join(f"{k} = %s" for k in where)
    with connection.cursor() as cur:
        cur.execute(f"SELECT DISTINCT tableoid::regclass::text FROM {table} WHERE {clause}", list(where.values()))
        return {r[0] for r in cur.fetchall()}


def names(parent: str) -> list[str]:
    return [p.name for p in partitions.partitions() if p.parent == parent]


def test_every_engine_statement_writes_the_runs_own_created_at_as_the_partition_key(make_org):
    """The correctness argument for uniq_event_run_seq: run_created_at is one value per run."""
    org = make_org()
    runs = [finished_run(org, "ok"), finished_run(org, "broken", fail=True)]
    with connection.cursor() as cur:
        for table in ("core_taskrunevent", "core_tasklog"):
            cur.execute(f"SELECT count(*), count(*) FILTER (WHERE x.run_created_at <> r.created_at) FROM {table} x "
                        "JOIN core_workflowrun r ON r.id = x.workflow_run_id WHERE r.id = ANY(%s)",
                        [[r.pk for r in runs]])
            total, wrong = cur.fetchone()
            assert wrong == 0, table
            if table == "core_taskrunevent":
                assert total >= 10  # started, claimed, started, succeeded/failed, finished ... of both runs


def test_a_taken_seq_is_refused_although_the_index_includes_the_partition_key(make_org):
    """Seed 001's trap: a unique index on a partitioned table must include the partition key.
    Here that key is the run's creation, not the row's time, so (run, seq) still collides."""
    run = finished_run(make_org(), "ok")
    with connection.cursor() as cur:
        cur.execute("SELECT pg_get_indexdef('uniq_event_run_seq'::regclass)")
        assert cur.fetchone()[0].endswith("USING btree (workflow_run_id, seq, run_created_at)")
    from django.db import IntegrityError, transaction

    first = TaskRunEvent.objects.unscoped().filter(workflow_run=run).order_by("seq").first()
    with pytest.raises(IntegrityError, match="duplicate key"), transaction.atomic():
        TaskRunEvent.objects.bulk_create([TaskRunEvent(
            organization_id=run.organization_id, workflow_run=run, run_created_at=run.created_at, seq=first.seq,
            kind="promoted")])


def test_ensure_ahead_continues_from_the_last_partition_on_a_database_with_rows(make_org, settings):
    org = make_org()
    run = finished_run(org, "before")
    stored = TaskRunEvent.objects.unscoped().filter(workflow_run=run).count()
    period = partitions.period_seconds()
    before = names("core_taskrunevent")
    last = max(p.hi for p in partitions.partitions() if p.parent == "core_taskrunevent")
    # Three periods later than the last partition's end (the clock was down): from that
    # period on. No run can have been created in the gap (its first event had no partition).
    later = last + dt.timedelta(seconds=3 * period)
    created = partitions.ensure_ahead(now=later)
    after = [p for p in partitions.partitions() if p.parent == "core_taskrunevent"]
    assert [p.name for p in after][: len(before)] == before  # nothing existing was touched
    new = [p for p in after if p.name not in before]
    assert new[0].lo == partitions.floor(later)
    assert all(b.lo == a.hi for a, b in zip(new, new[1:], strict=False))  # no gap, no overlap
    assert new[-1].hi == partitions.floor(later) + dt.timedelta(seconds=period * (settings.FLOWFORGE_HISTORY_PARTITIONS_AHEAD + 1))
    assert sorted(created) == sorted([p.name for p in new] + [p.name.replace("core_taskrunevent", "core_tasklog")
                                                             for p in new])
    assert partitions.ensure_ahead(now=later) == []  # a second pass has nothing to do
    # The rows already stored stayed where they were, whole.
    assert TaskRunEvent.objects.unscoped().filter(workflow_run=run).count() == stored
    assert partition_of("core_taskrunevent", workflow_run_id=run.pk) == {
        p.name for p in partitions.partitions() if p.parent == "core_taskrunevent" and p.lo <= run.created_at < p.hi}


def test_the_next_period_adds_one_partition_after_the_last_in_each_table(db):
    last = {parent: max(p.hi for p in partitions.partitions() if p.parent == parent) for parent in partitions.PARENTS}
    now = dt.datetime.now(dt.UTC)
    ahead = partitions.ensure_ahead(now=now)  # the migration made them: nothing to do
    assert ahead == []
    created = partitions.ensure_ahead(now=now + DAY)  # a day on: one more period at the end
    assert sorted(created) == sorted(f"{parent}_p{last[parent]:%Y%m%dt%H%M%S}" for parent in partitions.PARENTS)


def test_a_run_at_each_side_of_a_period_boundary_keeps_all_its_history_in_its_own_partition(make_org):
    org = make_org()
    boundary = partitions.floor(dt.datetime.now(dt.UTC)) + DAY  # the next period's start (migration: 14 ahead)
    early, late = finished_run(org, "early"), finished_run(org, "late")
    with connection.cursor() as cur:
        for run, at in ((early, boundary - dt.timedelta(microseconds=1)), (late, boundary)):
            cur.execute("UPDATE core_workflowrun SET created_at = %s WHERE id = %s", [at, run.pk])
            cur.execute("UPDATE core_taskrunevent SET run_created_at = %s WHERE workflow_run_id = %s", [at, run.pk])
    # History written after the boundary (a later event of each) goes with its run.
    for run in (early, late):
        events.append(workflow_run_id=run.pk, kind="promoted", to_state="running", detail={})
    stamp = partitions.floor(boundary).strftime("%Y%m%dt%H%M%S")
    before = (partitions.floor(boundary) - DAY).strftime("%Y%m%dt%H%M%S")
    assert partition_of("core_taskrunevent", workflow_run_id=early.pk) == {f"core_taskrunevent_p{before}"}
    assert partition_of("core_taskrunevent", workflow_run_id=late.pk) == {f"core_taskrunevent_p{stamp}"}
    for run in (early, late):
        seqs = list(TaskRunEvent.objects.unscoped().filter(workflow_run=run).values_list("seq", flat=True))
        assert sorted(seqs) == list(range(1, len(seqs) + 1))  # gap-free across the move


@pytest.mark.django_db(transaction=True)
def test_two_managers_at_once_create_each_partition_exactly_once():
    far = partitions.floor(dt.datetime.now(dt.UTC) + 5 * 365 * DAY)  # past every other test's partitions
    barrier = threading.Barrier(2)
    results: list[list[str]] = [[], []]
    errors: list[BaseException] = []

    def manager(i: int) -> None:
        try:
            barrier.wait(timeout=10)
            results[i] = partitions.ensure_ahead(now=far)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            connections.close_all()

    try:
        threads = [threading.Thread(target=manager, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert errors == []
        made = [p.name for p in partitions.partitions() if p.lo >= far]
        # Every partition from far on exists once, and exactly one manager reports each.
        assert sorted(results[0] + results[1]) == sorted(made)
        assert not set(results[0]) & set(results[1])
        per_table = sorted(p.lo for p in partitions.partitions() if p.lo >= far and p.parent == "core_tasklog")
        assert len(per_table) == len(set(per_table))
    finally:
        with connection.cursor() as cur:
            for p in partitions.partitions():
                if p.lo >= far:
                    cur.execute(f"DROP TABLE {p.name}")


def test_a_manager_that_finds_the_partitions_row_type_taken_reports_another_managers_creation(db):
    """The race's other outcome (migration 0035): the winner commits between the loser's check
    of the table's name and that of its row type, and the loser's CREATE TABLE fails with
    "type ... already exists" (duplicate_object). Made certain here by a domain of that name:
    a type with no relation, as the winner's is to the loser's snapshot."""
    lo = partitions.floor(dt.datetime.now(dt.UTC) + 6 * 365 * DAY)
    name = "core_tasklog_p" + lo.strftime("%Y%m%dt%H%M%S")
    with connection.cursor() as cur:
        cur.execute(f"CREATE DOMAIN {name} AS int")
    assert partitions.create("core_tasklog", lo, lo + DAY) is None  # before 0035: ProgrammingError
    assert name not in names("core_tasklog")
    with connection.cursor() as cur:  # the function's own work was rolled back: nothing half made
        cur.execute("SELECT to_regclass(%s)", [name])
        assert cur.fetchone()[0] is None


def drop_from(far: dt.datetime) -> None:
    with connection.cursor() as cur:
        for p in partitions.partitions():
            if p.lo >= far:
                cur.execute(f"DROP TABLE {p.name}")


@pytest.mark.django_db(transaction=True)
def test_a_period_missing_between_partitions_is_created_by_the_next_pass():
    """Found by review: a pass continued from the last partition, so a period one pass could
    not create (its parent's lock not had in time) stayed a gap for good, and every run
    created in it failed to start."""
    far = partitions.floor(dt.datetime.now(dt.UTC) + 7 * 365 * DAY)
    try:
        assert partitions.ensure_ahead(now=far)
        hole = far + 2 * DAY
        missing = [p.name for p in partitions.partitions() if p.lo == hole]
        assert len(missing) == 2  # one per table
        with connection.cursor() as cur:
            for name in missing:
                cur.execute(f"DROP TABLE {name}")
        assert sorted(partitions.ensure_ahead(now=far)) == sorted(missing)
        for parent in partitions.PARENTS:
            spans = sorted((p.lo, p.hi) for p in partitions.partitions() if p.parent == parent and p.lo >= far)
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))  # no gap, no overlap
    finally:
        drop_from(far)


@pytest.mark.django_db(transaction=True)
def test_a_period_whose_name_is_taken_is_logged_and_created_once_the_name_is_free(caplog):
    far = partitions.floor(dt.datetime.now(dt.UTC) + 7 * 365 * DAY)
    name = "core_tasklog_p" + (far + 2 * DAY).strftime("%Y%m%dt%H%M%S")
    try:
        with connection.cursor() as cur:
            cur.execute(f"CREATE DOMAIN {name} AS int")
        with caplog.at_level("ERROR", logger="engine.partitions"):
            created = partitions.ensure_ahead(now=far)
        assert name not in created and name.replace("core_tasklog", "core_taskrunevent") in created
        assert f"core_tasklog has no partition for runs created in [{(far + 2 * DAY).isoformat()}" in caplog.text
        with connection.cursor() as cur:
            cur.execute(f"DROP DOMAIN {name}")
        assert partitions.ensure_ahead(now=far) == [name]
    finally:
        with connection.cursor() as cur:
            cur.execute("SELECT 1 FROM pg_type WHERE typname = %s AND typtype = 'd'", [name])
            if cur.fetchone():
                cur.execute(f"DROP DOMAIN {name}")
        drop_from(far)


@pytest.mark.django_db(transaction=True)
def test_a_raised_period_fills_from_now_not_from_its_longer_periods_start(settings):
    """Found by review: after the period setting was raised, floor(now, new period) lay
    before the first partition, and each pass created a partition for that past stretch
    (which the retention's drop then removed again, every pass)."""
    far = partitions.floor(dt.datetime.now(dt.UTC) + 7 * 365 * DAY, 86400)
    now = far + dt.timedelta(hours=15, minutes=30)
    settings.FLOWFORGE_HISTORY_PARTITIONS_AHEAD = 2
    try:
        settings.FLOWFORGE_HISTORY_PARTITION_SECONDS = 3600
        assert len(partitions.ensure_ahead(now=now)) == 2 * 3  # hours 15, 16 and 17
        settings.FLOWFORGE_HISTORY_PARTITION_SECONDS = 86400
        created = partitions.ensure_ahead(now=now)
        made = {p.name: p for p in partitions.partitions() if p.lo >= far}
        assert created and all(made[name].hi > now for name in created)
        for parent in partitions.PARENTS:
            spans = sorted((p.lo, p.hi) for p in made.values() if p.parent == parent)
            assert spans[0] == (far + dt.timedelta(hours=15), far + dt.timedelta(hours=16))  # nothing before
            assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
            assert spans[-1][1] == far + 3 * DAY
        assert partitions.ensure_ahead(now=now) == []
    finally:
        drop_from(far)


def old_partitions(day: dt.datetime) -> None:
    """Partitions of one day of 1990 in both tables (older than any retention)."""
    for parent in partitions.PARENTS:
        assert partitions.create(parent, day, day + DAY)


def test_a_partition_older_than_every_retention_is_dropped_whole_once_its_runs_are_purged(make_org, settings,
                                                                                          offload_dir):  # noqa: F811
    settings.FLOWFORGE_RUN_RETENTION_SECONDS = 30 * 86400
    org = make_org()
    day = dt.datetime(1990, 1, 1, tzinfo=dt.UTC)
    old_partitions(day)
    old, recent = finished_run(org, "old"), finished_run(org, "recent")
    decorate(org, old, offload_dir)
    with connection.cursor() as cur:  # created in that day, its history with it
        cur.execute("UPDATE core_workflowrun SET created_at = %s, finished_at = %s WHERE id = %s",
                    [day + dt.timedelta(hours=12), day + dt.timedelta(hours=13), old.pk])
        for table in ("core_taskrunevent", "core_tasklog"):
            cur.execute(f"UPDATE {table} SET run_created_at = %s WHERE workflow_run_id = %s",
                        [day + dt.timedelta(hours=12), old.pk])
    assert partition_of("core_taskrunevent", workflow_run_id=old.pk) == {"core_taskrunevent_p19900101t000000"}
    assert partitions.drop_horizon() == day + DAY
    result = retention.purge()
    assert result.runs == 1
    assert sorted(result.partitions) == ["core_tasklog_p19900101t000000", "core_taskrunevent_p19900101t000000"]
    assert not WorkflowRun.objects.unscoped().filter(pk=old.pk).exists()
    assert not TaskRunEvent.objects.unscoped().filter(workflow_run_id=old.pk).exists()
    assert not TaskLog.objects.unscoped().filter(workflow_run_id=old.pk).exists()
    assert "core_taskrunevent_p19900101t000000" not in names("core_taskrunevent")
    assert TaskRunEvent.objects.unscoped().filter(workflow_run=recent).count() >= 4  # others untouched


def test_a_partition_is_kept_while_a_run_of_its_period_is_kept(make_org, settings):
    settings.FLOWFORGE_RUN_RETENTION_SECONDS = 30 * 86400
    org = make_org()
    day = dt.datetime(1990, 1, 1, tzinfo=dt.UTC)
    old_partitions(day)
    running = finished_run(org, "still")
    with connection.cursor() as cur:  # a run of that day is running again (resumed): it is kept
        cur.execute("UPDATE core_workflowrun SET created_at = %s, state = 'running', finished_at = NULL "
                    "WHERE id = %s", [day + dt.timedelta(hours=1), running.pk])
        cur.execute("UPDATE core_taskrunevent SET run_created_at = %s WHERE workflow_run_id = %s",
                    [day + dt.timedelta(hours=1), running.pk])
    assert retention.purge().partitions == []
    assert "core_taskrunevent_p19900101t000000" in names("core_taskrunevent")
    assert TaskRunEvent.objects.unscoped().filter(workflow_run=running).exists()


def test_no_partition_is_dropped_while_an_organization_keeps_runs_forever(make_org, settings):
    settings.FLOWFORGE_RUN_RETENTION_SECONDS = 30 * 86400
    org, keeper = make_org(), make_org()
    Organization.objects.filter(pk=keeper.pk).update(run_retention_days=0)
    day = dt.datetime(1990, 1, 1, tzinfo=dt.UTC)
    old_partitions(day)
    old = finished_run(org, "old")
    age(old, (dt.datetime.now(dt.UTC) - day - dt.timedelta(hours=12)).total_seconds() / 86400)  # into that day
    assert partitions.drop_horizon() is None
    assert retention.purge().runs == 1
    # Without a horizon the purge removed the run's history row by row; the partition stays.
    assert not TaskRunEvent.objects.unscoped().filter(workflow_run_id=old.pk).exists()
    assert "core_taskrunevent_p19900101t000000" in names("core_taskrunevent")
    assert partitions.drop_expired() == []


def test_the_drop_function_refuses_what_is_not_a_history_partition_and_a_period_not_over(make_org):
    from django.db import DataError, ProgrammingError, transaction

    with pytest.raises((DataError, ProgrammingError), match="not a partition of a history table"), \
            transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT ff_history_partition_drop('core_workflowrun')")
    current = [p for p in partitions.partitions() if p.lo <= dt.datetime.now(dt.UTC) < p.hi]
    assert len(current) == 2
    with connection.cursor() as cur:
        cur.execute("SELECT ff_history_partition_drop(%s)", [current[0].name])
        assert cur.fetchone()[0] is False
    assert current[0].name in {p.name for p in partitions.partitions()}
    with pytest.raises((DataError, ProgrammingError), match="not a partitioned history table"), \
            transaction.atomic(), connection.cursor() as cur:
        cur.execute("SELECT ff_history_partition_create('core_workflowrun', now(), now() + interval '1 day')")
    # Never a partition that could not be dropped, or one reaching far past the manager's.
    for lo, hi in (("2027-01-01", "infinity"), ("-infinity", "2027-01-01"), ("2027-01-01", "10000-01-01"),
                   ("1900-01-01", "1900-01-02")):
        with pytest.raises((DataError, ProgrammingError), match="outside 1970 to ten years from now"), \
                transaction.atomic(), connection.cursor() as cur:
            cur.execute("SELECT ff_history_partition_create('core_tasklog', %s, %s)", [lo, hi])
    assert all(p.hi.year < 2100 for p in partitions.partitions())


def test_the_metrics_show_the_partitions_ahead(make_org, settings):
    from engine import metrics

    body = "\n".join(metrics._db_gauges())
    gauges = dict(line.rsplit(" ", 1) for line in body.splitlines() if line and not line.startswith("#"))
    ahead = settings.FLOWFORGE_HISTORY_PARTITIONS_AHEAD + 1  # the current period's and those ahead
    assert int(gauges['flowforge_history_partitions_ahead{table="core_taskrunevent"}']) >= ahead
    assert int(gauges['flowforge_history_partitions{table="core_tasklog"}']) >= ahead


def test_the_application_role_makes_partitions_only_through_the_managers_functions(make_org):
    """The role the application connects as (docs/audit.md) owns no table: it cannot create
    or drop a partition itself, only through ff_history_partition_create / _drop."""
    from django.core.management import call_command
    from django.db import ProgrammingError, transaction

    call_command("grant_app_role", "ff_test_partitions_app")
    far = partitions.floor(dt.datetime.now(dt.UTC) + 6 * 365 * DAY)
    name = f"core_taskrunevent_p{far:%Y%m%dt%H%M%S}"
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute("SET LOCAL ROLE ff_test_partitions_app")
        with pytest.raises(ProgrammingError, match="permission denied"), transaction.atomic():
            cur.execute("CREATE TABLE core_taskrunevent_x PARTITION OF core_taskrunevent "
                        "FOR VALUES FROM ('2030-01-01') TO ('2030-01-02')")
        cur.execute("SELECT ff_history_partition_create('core_taskrunevent', %s, %s)", [far, far + DAY])
        assert cur.fetchone()[0] == name
        with pytest.raises(ProgrammingError, match="must be owner"), transaction.atomic():
            cur.execute(f"DROP TABLE {name}")
        cur.execute("RESET ROLE")
        cur.execute(f"DROP TABLE {name}")


def test_staff_see_the_history_storage_page_and_members_do_not(make_org, settings):
    import uuid

    from django.test import Client

    from tenancy.models import User

    settings.FLOWFORGE_RUN_RETENTION_SECONDS = 30 * 86400
    org = make_org()
    old = finished_run(org, "old")
    age(old, 40)  # 10 days past the retention, not purged yet
    staff = User.objects.create_superuser(email=f"staff-{uuid.uuid4().hex[:6]}@flowforge.example",
                                          password="x-long-pass-123")
    client = Client()
    client.force_login(staff)
    assert 'href="/admin/engine/workflowrun/history/"' in client.get("/admin/engine/workflowrun/").content.decode()
    page = client.get("/admin/engine/workflowrun/history/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "<code>core_taskrunevent</code>" in html and "<code>core_tasklog</code>" in html
    ahead = settings.FLOWFORGE_HISTORY_PARTITIONS_AHEAD + 1
    assert html.count(f'data-ahead="{ahead}"') == 2
    row = html[html.index(f'data-org="{org.slug}"'):]
    row = row[: row.index("</tr>")]
    assert "30 days" in row and 'data-backlog="1"' in row and "10 days, " in row  # the purge's lag
    member = User.objects.create_user(email=f"m-{uuid.uuid4().hex[:6]}@flowforge.example", password="x-long-pass-123")
    client.force_login(member)
    assert client.get("/admin/engine/workflowrun/history/").status_code == 302  # to the admin's login


@pytest.mark.parametrize(("name", "value", "message"), [
    ("FLOWFORGE_RUN_RETENTION_DAYS", "2.5", "expected a whole number of days from 0 to 36500"),
    ("FLOWFORGE_RUN_RETENTION_DAYS", "1e9", "expected a whole number of days from 0 to 36500"),
    ("FLOWFORGE_RUN_RETENTION_SECONDS", "1e12", "expected a number of seconds from 0 to 3153600000"),
    ("FLOWFORGE_RUN_RETENTION_SECONDS", "-1", "expected a number of seconds from 0 to 3153600000"),
    ("FLOWFORGE_HISTORY_PARTITION_SECONDS", "1e9", "expected 60 to 2678400 seconds"),
    ("FLOWFORGE_HISTORY_PARTITION_SECONDS", "30", "expected 60 to 2678400 seconds"),
    ("FLOWFORGE_HISTORY_PARTITIONS_AHEAD", "1000", "FLOWFORGE_HISTORY_PARTITIONS_AHEAD 2 to 100 periods"),
])
def test_a_retention_or_partition_setting_out_of_range_is_refused_at_start(name, value, message):
    """Reviewer's finding: 1e12 seconds passed the check and then failed every purge and
    scrape with 'timestamp out of range'; 2.5 days became 2."""
    import os
    import subprocess
    import sys

    from flowforge.stack import BASE_DIR

    env = {**os.environ, name: value, "DJANGO_SETTINGS_MODULE": "flowforge.settings"}
    proc = subprocess.run([sys.executable, "-c", "import django; django.setup()"], cwd=BASE_DIR, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-500:]
