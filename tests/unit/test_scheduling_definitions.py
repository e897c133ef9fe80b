"""Definition documents: the scheduling fields of issue 16 — a task's priority,
concurrency and rate_limit, the workflow's concurrency block — validated with the field
named and nothing stored, normalized, and stored in their columns; the stored-definitions
quota (max_definition_bytes) under a per-organization lock, through the service and the
API (422). Real PostgreSQL."""

from __future__ import annotations

import json
import threading

import pytest
from django.db import connection, connections

from engine.definitions import (
    PRIORITY_MAX,
    PRIORITY_MIN,
    RUN_LIMIT_POLICIES,
    DefinitionError,
    render_concurrency_key,
    validate_document,
)
from engine.models import PRIORITY_MAX as MODEL_PRIORITY_MAX
from engine.models import PRIORITY_MIN as MODEL_PRIORITY_MIN
from engine.models import RunLimitPolicy, Task, TaskDependency, Workflow
from engine.services import apply_definition
from tenancy.limits import QuotaExceeded
from tenancy.models import Organization, Role
from tests.unit.test_api_auth import bearer
from tests.unit.test_api_workflows import new_api_factory


def doc(*tasks: dict, **top) -> dict:
    return {"name": "charges", "tasks": list(tasks), **top}


def task(key: str = "charge", **fields) -> dict:
    return {"key": key, "type": "noop", **fields}


def counts(org) -> tuple[int, int, int]:
    return (Workflow.objects.for_organization(org).count(), Task.objects.for_organization(org).count(),
            TaskDependency.objects.for_organization(org).count())


def test_the_definitions_priority_range_and_policies_are_the_models():
    assert (PRIORITY_MIN, PRIORITY_MAX) == (MODEL_PRIORITY_MIN, MODEL_PRIORITY_MAX) == (-10, 10)
    assert set(RUN_LIMIT_POLICIES) == set(RunLimitPolicy.values)


# (document, the path named, a part of its message)
BAD = [
    (doc(task(priority=11)), "tasks[charge].priority", "must be a whole number from -10 to 10, got 11"),
    (doc(task(priority=-11)), "tasks[charge].priority", "must be a whole number from -10 to 10, got -11"),
    (doc(task(priority=1.5)), "tasks[charge].priority", "must be a whole number from -10 to 10, got 1.5"),
    (doc(task(priority="3")), "tasks[charge].priority", "must be a whole number from -10 to 10, got '3'"),
    (doc(task(priority=True)), "tasks[charge].priority", "must be a whole number from -10 to 10, got True"),
    (doc(task(concurrency={"key": "stripe", "limit": 0})), "tasks[charge].concurrency.limit",
     "must be at least 1, got 0"),
    (doc(task(concurrency={"key": "stripe", "limit": -2})), "tasks[charge].concurrency.limit",
     "must be at least 1, got -2"),
    (doc(task(concurrency={"key": "stripe", "limit": 2.5})), "tasks[charge].concurrency.limit",
     "must be a whole number, got 2.5"),
    (doc(task(concurrency={"key": "stripe", "limit": "5"})), "tasks[charge].concurrency.limit",
     "must be a whole number, got '5'"),
    (doc(task(concurrency={"key": "stripe"})), "tasks[charge].concurrency.limit",
     "a key without a limit is unconfigured"),
    (doc(task(concurrency={"key": "stripe", "limit": None})), "tasks[charge].concurrency.limit",
     "a key without a limit is unconfigured"),
    (doc(task(concurrency={"key": "stripe", "limit": 5, "per": "org"})), "tasks[charge].concurrency.per",
     "unknown field; allowed: key, limit"),
    (doc(task(concurrency={"limit": 5})), "tasks[charge].concurrency.key", "required"),
    (doc(task(concurrency={"key": "str ipe", "limit": 5})), "tasks[charge].concurrency.key", "' ' not allowed"),
    (doc(task(concurrency={"key": "stripe/eu", "limit": 5})), "tasks[charge].concurrency.key", "'/' not allowed"),
    (doc(task(concurrency={"key": "x" * 201, "limit": 5})), "tasks[charge].concurrency.key",
     "at most 200 characters, got 201"),
    (doc(task(concurrency={"key": 7, "limit": 5})), "tasks[charge].concurrency.key", "must be a string"),
    (doc(task(concurrency={"key": "c-{{ customer_id }}", "limit": 2})), "tasks[charge].concurrency.key",
     "a placeholder must be {{ input.<dotted path> }}"),
    (doc(task(concurrency={"key": "c-{{ input.a | upper }}", "limit": 2})), "tasks[charge].concurrency.key",
     "a placeholder must be {{ input.<dotted path> }}"),
    (doc(task(concurrency={"key": "c-{{ input. }}", "limit": 2})), "tasks[charge].concurrency.key",
     "a placeholder must be {{ input.<dotted path> }}"),
    (doc(task(concurrency={"key": "c-{ input.a }", "limit": 2})), "tasks[charge].concurrency.key",
     "a placeholder must be {{ input.<dotted path> }}"),
    (doc(task(concurrency="stripe")), "tasks[charge].concurrency", "must be an object"),
    (doc(task(rate_limit={"key": "github", "per_second": 10, "per_minute": 100})), "tasks[charge].rate_limit",
     "exactly one of per_second or per_minute, not both"),
    (doc(task(rate_limit={"key": "github"})), "tasks[charge].rate_limit", "exactly one of per_second or per_minute"),
    (doc(task(rate_limit={"key": "github", "per_second": 0})), "tasks[charge].rate_limit.per_second",
     "must be at least 1, got 0"),
    (doc(task(rate_limit={"key": "github", "per_minute": -1})), "tasks[charge].rate_limit.per_minute",
     "must be at least 1, got -1"),
    (doc(task(rate_limit={"key": "github", "per_minute": 0.5})), "tasks[charge].rate_limit.per_minute",
     "must be a whole number, got 0.5"),
    (doc(task(rate_limit={"key": "github", "per_hour": 5})), "tasks[charge].rate_limit.per_hour",
     "unknown field; allowed: key, per_minute, per_second"),
    (doc(task(rate_limit={"key": "gh-{{ input.org }}", "per_second": 5})), "tasks[charge].rate_limit.key",
     "placeholders are not allowed in a rate-limit key"),
    (doc(task(rate_limit={"key": "git hub", "per_second": 5})), "tasks[charge].rate_limit.key", "' ' not allowed"),
    (doc(task(rate_limit={"per_second": 5})), "tasks[charge].rate_limit.key", "required"),
    (doc(task(), concurrency={"max_running_runs": 0}), "concurrency.max_running_runs", "must be at least 1, got 0"),
    (doc(task(), concurrency={"max_running_tasks": -3}), "concurrency.max_running_tasks",
     "must be at least 1, got -3"),
    (doc(task(), concurrency={"max_running_tasks": 2.5}), "concurrency.max_running_tasks",
     "must be a whole number, got 2.5"),
    (doc(task(), concurrency={"max_running_runs": 2, "policy": "drop"}), "concurrency.policy",
     "must be one of queue, cancel_newest, cancel_oldest, got 'drop'"),
    (doc(task(), concurrency={"max_running_runs": 2, "overlap": "skip"}), "concurrency.overlap",
     "unknown field; allowed: max_running_runs, max_running_tasks, policy"),
    (doc(task(), concurrency=3), "concurrency", "must be an object"),
    (doc(task("a", concurrency={"key": "stripe", "limit": 5}), task("b", concurrency={"key": "stripe", "limit": 3})),
     "tasks[b].concurrency.limit", "key 'stripe' has limit 5 in task 'a'; one key has one limit within a workflow"),
    # One rate key, one limit per window: its tasks share one bucket (a review saw 3/s and
    # 5/s on one key admit 5, and "5/3 per second" in the wait reason).
    (doc(task("a", rate_limit={"key": "gh2", "per_second": 3}), task("b", rate_limit={"key": "gh2", "per_second": 5})),
     "tasks[b].rate_limit.per_second",
     "key 'gh2' has per_second 3 in task 'a'; one key has one limit per window within a workflow"),
    # Two spellings of one placeholder are one key (stored in the first form).
    (doc(task("a", concurrency={"key": "k-{{ input.x }}", "limit": 2}),
         task("b", concurrency={"key": "k-{{input.x}}", "limit": 3})),
     "tasks[b].concurrency.limit", "key 'k-{{ input.x }}' has limit 2 in task 'a'; one key has one limit"),
    (doc(task("a", concurrency={"key": "k-{{input.x}}", "limit": 2}),
         task("b", concurrency={"key": "k-{{   input.x\t}}", "limit": 3})),
     "tasks[b].concurrency.limit", "key 'k-{{ input.x }}' has limit 2 in task 'a'; one key has one limit"),
    # A trailing newline is not a key character ("$" matched before it: stored).
    (doc(task(concurrency={"key": "k\n", "limit": 3})), "tasks[charge].concurrency.key",
     "'k\\n': '\\n' not allowed"),
    (doc(task(concurrency={"key": "k-{{ input.x }}\n", "limit": 3})), "tasks[charge].concurrency.key",
     "'\\n' not allowed"),
    (doc(task(rate_limit={"key": "r\n", "per_second": 5})), "tasks[charge].rate_limit.key",
     "'r\\n': '\\n' not allowed"),
    ({"name": "nlname\n", "tasks": [task("a")]}, "name", "'nlname\\n': use 1-200 letters"),
    (doc(task("a\n")), "tasks[0].key", "'a\\n' is not a valid key"),
    # Whole numbers are JSON integers: 2.0 is refused like "2" and true.
    (doc(task(priority=2.0)), "tasks[charge].priority", "must be a whole number from -10 to 10, got 2.0"),
    (doc(task(concurrency={"key": "stripe", "limit": 2.0})), "tasks[charge].concurrency.limit",
     "must be a whole number, got 2.0"),
    (doc(task(rate_limit={"key": "github", "per_second": 3.0})), "tasks[charge].rate_limit.per_second",
     "must be a whole number, got 3.0"),
    (doc(task(rate_limit={"key": "github", "per_minute": 60.0})), "tasks[charge].rate_limit.per_minute",
     "must be a whole number, got 60.0"),
    (doc(task(rate_limit={"key": "github", "per_minute": True})), "tasks[charge].rate_limit.per_minute",
     "must be a whole number, got True"),
    (doc(task(), concurrency={"max_running_tasks": 2.0}), "concurrency.max_running_tasks",
     "must be a whole number, got 2.0"),
    (doc(task(), concurrency={"max_running_runs": 1.0}), "concurrency.max_running_runs",
     "must be a whole number, got 1.0"),
    (doc(task(), concurrency={"max_running_runs": "2"}), "concurrency.max_running_runs",
     "must be a whole number, got '2'"),
    (doc(task(max_attempts=3.0)), "tasks[charge].max_attempts", "must be a whole number, got 3.0"),
    # A cancel_* policy decides a start over max_running_runs: without it, it would do nothing.
    (doc(task(), concurrency={"policy": "cancel_oldest"}), "concurrency.policy",
     "policy applies only with max_running_runs; 'cancel_oldest' without it would do nothing"),
    (doc(task(), concurrency={"max_running_tasks": 2, "policy": "cancel_oldest"}), "concurrency.policy",
     "policy applies only with max_running_runs"),
    (doc(task(), concurrency={"max_running_tasks": 2, "max_running_runs": None, "policy": "cancel_newest"}),
     "concurrency.policy", "policy applies only with max_running_runs"),
    # The length is the stored form's: "{{input.x}}" (11 characters) is stored as
    # "{{ input.x }}" (13), so 188 + 13 = 201.
    (doc(task(concurrency={"key": "x" * 188 + "{{input.x}}", "limit": 1})), "tasks[charge].concurrency.key",
     "at most 200 characters (each placeholder counted as {{ input.<path> }}), got 201"),
]


@pytest.mark.django_db
@pytest.mark.parametrize(("document", "path", "message"), BAD, ids=[f"{b[1]}-{i}" for i, b in enumerate(BAD)])
def test_a_bad_scheduling_field_is_refused_naming_it_and_nothing_is_stored(org, document, path, message):
    before = counts(org)
    with pytest.raises(DefinitionError) as excinfo:
        apply_definition(organization=org, document=document)
    assert [e for e in excinfo.value.errors if e["path"] == path and message in e["message"]], excinfo.value.errors
    assert counts(org) == before


@pytest.mark.django_db
def test_one_key_with_one_limit_in_two_tasks_is_fine_and_so_are_two_keys():
    normalized = validate_document(doc(task("a", concurrency={"key": "stripe", "limit": 5}),
                                       task("b", concurrency={"key": "stripe", "limit": 5}),
                                       task("c", concurrency={"key": "paypal", "limit": 1})))
    assert [t["concurrency"] for t in normalized["tasks"]] == [
        {"key": "stripe", "limit": 5}, {"key": "stripe", "limit": 5}, {"key": "paypal", "limit": 1}]
    # A rate key: one limit per window (a second and a minute are two buckets).
    normalized = validate_document(doc(task("a", rate_limit={"key": "gh", "per_second": 3}),
                                       task("b", rate_limit={"key": "gh", "per_second": 3}),
                                       task("c", rate_limit={"key": "gh", "per_minute": 100})))
    assert [t["rate_limit"] for t in normalized["tasks"]] == [
        {"key": "gh", "per_second": 3}, {"key": "gh", "per_second": 3}, {"key": "gh", "per_minute": 100}]


@pytest.mark.django_db
def test_scheduling_fields_are_normalized_and_absent_ones_stay_absent():
    normalized = validate_document(doc(
        task("a", priority=-3, concurrency={"key": "cust-{{input.customer.id}}:eu", "limit": 2},
             rate_limit={"key": "github.api", "per_minute": 600}),
        task("b", priority=0, rate_limit={"key": "github.api", "per_second": 10}),
        task("c"),
        concurrency={"max_running_runs": 2}))
    a, b, c = normalized["tasks"]
    # The placeholder in its one stored form.
    assert (a["priority"], a["concurrency"], a["rate_limit"]) == (
        -3, {"key": "cust-{{ input.customer.id }}:eu", "limit": 2}, {"key": "github.api", "per_minute": 600})
    assert b["rate_limit"] == {"key": "github.api", "per_second": 10}
    assert not {"priority", "concurrency", "rate_limit"} & set(b) - {"rate_limit"}
    assert not {"priority", "concurrency", "rate_limit"} & set(c)
    assert normalized["concurrency"] == {"max_running_runs": 2, "policy": "queue"}
    assert "concurrency" not in validate_document(doc(task()))
    # queue, the default, is what happens anyway; a normalized document carries it, and
    # validates again as it is (a stored version is re-validated on restore).
    only_tasks = validate_document(doc(task(), concurrency={"max_running_tasks": 4, "policy": "queue"}))
    assert only_tasks["concurrency"] == {"max_running_tasks": 4, "policy": "queue"}
    assert validate_document(only_tasks) == only_tasks
    assert validate_document(doc(task(), concurrency={"max_running_runs": 1, "policy": "cancel_oldest"}))[
        "concurrency"] == {"max_running_runs": 1, "policy": "cancel_oldest"}


@pytest.mark.django_db
def test_placeholders_are_stored_in_one_form_and_two_spellings_with_one_limit_are_one_key(org):
    wf = apply_definition(organization=org, document=doc(
        task("a", concurrency={"key": "k-{{input.x}}", "limit": 2}),
        task("b", concurrency={"key": "k-{{ input.x }}", "limit": 2}),
        task("c", concurrency={"key": "x" * 187 + "{{input.x}}", "limit": 1})))  # stored: 187 + 13 = 200
    rows = dict(Task.objects.for_organization(org).filter(workflow=wf).values_list("key", "concurrency_key"))
    assert rows == {"a": "k-{{ input.x }}", "b": "k-{{ input.x }}", "c": "x" * 187 + "{{ input.x }}"}
    assert [t["concurrency"]["key"] for t in wf.definition["tasks"]] == [
        "k-{{ input.x }}", "k-{{ input.x }}", "x" * 187 + "{{ input.x }}"]
    assert render_concurrency_key(rows["a"], {"x": 5}, task_key="a") == "k-5"


@pytest.mark.django_db
def test_applying_stores_the_scheduling_columns(org):
    wf = apply_definition(organization=org, document=doc(
        task("a", priority=7, concurrency={"key": "customer-{{ input.customer_id }}", "limit": 2}),
        task("b", rate_limit={"key": "github", "per_minute": 30}, depends_on=["a"]),
        task("c", rate_limit={"key": "github", "per_second": 3}, priority=-10),
        concurrency={"max_running_tasks": 4, "max_running_runs": 2, "policy": "cancel_newest"}))
    wf.refresh_from_db()
    assert (wf.max_running_tasks, wf.max_running_runs, wf.run_limit_policy) == (4, 2, "cancel_newest")
    rows = {t.key: (t.priority, t.concurrency_key, t.concurrency_limit, t.rate_key, t.rate_limit,
                    t.rate_window_seconds) for t in Task.objects.for_organization(org).filter(workflow=wf)}
    assert rows == {
        "a": (7, "customer-{{ input.customer_id }}", 2, None, None, None),
        "b": (0, None, None, "github", 30, 60),
        "c": (-10, None, None, "github", 3, 1),
    }
    plain = apply_definition(organization=org, document={"name": "plain", "tasks": [task("x")]})
    plain.refresh_from_db()
    assert (plain.max_running_tasks, plain.max_running_runs, plain.run_limit_policy) == (None, None, "queue")


# --- rendering a key ----------------------------------------------------------------------------

INPUT = {"customer_id": "cus_42", "n": 7, "ratio": 2.5, "flag": True, "off": False, "zero": 0,
         "nested": {"region": {"code": "eu-1"}}, "obj": {"a": 1}, "arr": [1], "none": None, "empty": ""}


@pytest.mark.parametrize(("template", "rendered"), [
    ("customer-{{ input.customer_id }}", "customer-cus_42"),
    ("{{input.customer_id}}", "cus_42"),
    ("n-{{ input.n }}", "n-7"),
    ("r-{{ input.ratio }}", "r-2.5"),
    ("f-{{ input.flag }}-{{ input.off }}", "f-true-false"),
    ("z-{{ input.zero }}", "z-0"),
    ("{{ input.nested.region.code }}:{{ input.customer_id }}", "eu-1:cus_42"),
    ("e-{{ input.empty }}", "e-"),
    ("stripe", "stripe"),
])
def test_a_key_renders_each_kind_of_value(template, rendered):
    assert render_concurrency_key(template, INPUT, task_key="charge") == rendered


@pytest.mark.parametrize(("template", "message"), [
    ("c-{{ input.customer }}", "task 'charge': its concurrency key 'c-{{ input.customer }}' needs input.customer, "
     "which the run input does not have"),
    ("c-{{ input.nested.region.name }}", "needs input.nested.region.name, which the run input does not have"),
    ("c-{{ input.customer_id.x }}", "needs input.customer_id.x, which the run input does not have"),
    ("c-{{ input.obj }}", "needs input.obj to be a string, number or boolean, not an object"),
    ("c-{{ input.arr }}", "needs input.arr to be a string, number or boolean, not an array"),
    ("c-{{ input.none }}", "needs input.none to be a string, number or boolean, not null"),
    ("{{ input.empty }}", "renders to an empty key"),
])
def test_a_key_that_the_input_cannot_fill_is_refused_naming_the_task_and_field(template, message):
    with pytest.raises(ValueError) as excinfo:
        render_concurrency_key(template, INPUT, task_key="charge")
    assert message in str(excinfo.value)


@pytest.mark.parametrize(("value", "named"), [
    ("cus\n", "U+000A control character"),
    ("cus\r", "U+000D control character"),
    ("a\tb", "U+0009 control character"),
    ("a\x1bb", "U+001B control character"),
    ("a\x7f", "U+007F control character"),
    ("a\x85", "U+0085 control character"),
    ("\u202ecus", "U+202E RIGHT-TO-LEFT OVERRIDE"),
    ("\u202acus", "U+202A LEFT-TO-RIGHT EMBEDDING"),
    ("\u2066cus\u2069", "U+2066 LEFT-TO-RIGHT ISOLATE"),
    ("cus\u2069", "U+2069 POP DIRECTIONAL ISOLATE"),
    ("\u200ecus", "U+200E LEFT-TO-RIGHT MARK"),
    ("\u200fcus", "U+200F RIGHT-TO-LEFT MARK"),
    ("a\u2028b", "U+2028 LINE SEPARATOR"),
])
def test_a_value_with_a_control_line_break_or_bidi_character_is_refused_naming_task_field_and_character(value, named):
    with pytest.raises(ValueError) as excinfo:
        render_concurrency_key("c-{{ input.v }}", {"v": value}, task_key="charge")
    assert str(excinfo.value) == (
        f"task 'charge': its concurrency key 'c-{{{{ input.v }}}}' cannot use input.v: it holds {named}; "
        "control characters, line breaks and bidirectional text controls are not allowed in a key")


def test_other_text_renders_as_is_and_nul_is_dropped():
    assert render_concurrency_key("c-{{ input.v }}", {"v": "Zürich·東京 é"}, task_key="t") == "c-Zürich·東京 é"
    assert render_concurrency_key("c-{{ input.v }}", {"v": "a\x00b"}, task_key="t") == "c-ab"


def test_a_rendered_key_over_400_characters_is_refused():
    with pytest.raises(ValueError, match="renders to 401 characters; at most 400"):
        render_concurrency_key("k{{ input.v }}", {"v": "x" * 400}, task_key="charge")
    assert len(render_concurrency_key("{{ input.v }}", {"v": "x" * 400}, task_key="charge")) == 400


# --- the stored-definitions quota ---------------------------------------------------------------


def stored_bytes(org) -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT coalesce(sum(octet_length(definition::text)), 0) FROM core_workflow "
                    "WHERE organization_id = %s", [org.pk])
        return cur.fetchone()[0]


def set_quota(org, **overrides) -> None:
    Organization.objects.filter(pk=org.pk).update(**overrides)
    org.refresh_from_db()


@pytest.mark.django_db
def test_the_definition_bytes_quota_counts_every_stored_version_and_the_new_one(org):
    document = doc(task("a"), task("b", depends_on=["a"]))
    apply_definition(organization=org, document=document)
    one = stored_bytes(org)  # a second version of the same document stores the same text again
    assert one > 0
    set_quota(org, max_definition_bytes_override=2 * one - 1)
    before = counts(org)
    with pytest.raises(QuotaExceeded) as excinfo:
        apply_definition(organization=org, document=document)
    exc = excinfo.value
    assert (exc.limit, exc.used, exc.allowed, exc.retry_after_seconds) == ("max_definition_bytes", one, 2 * one - 1,
                                                                           None)
    assert str(exc) == (f"stored definitions quota (max_definition_bytes) exceeded: the organization stores {one} "
                        f"bytes of workflow definitions, this version adds {one}, and the limit is {2 * one - 1} "
                        "bytes; stored versions (archived ones too) keep counting, so ask staff to raise "
                        "max_definition_bytes")
    assert "delete" not in str(exc)  # no version can be deleted (DELETE /workflows/<id>/ is 405)
    assert counts(org) == before
    set_quota(org, max_definition_bytes_override=2 * one)  # exactly full is within the quota
    assert apply_definition(organization=org, document=document).version == 2
    assert stored_bytes(org) == 2 * one


@pytest.mark.django_db
def test_the_quota_is_per_organization(make_org):
    a, b = make_org(), make_org()
    apply_definition(organization=a, document=doc(task()))
    one = stored_bytes(a)
    set_quota(b, max_definition_bytes_override=one)
    apply_definition(organization=b, document=doc(task()))  # a's bytes do not count for b
    assert stored_bytes(b) == one


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_applies_cannot_both_fit_in_the_last_bytes(org):
    apply_definition(organization=org, document={"name": "probe", "tasks": [task()]})
    one = stored_bytes(org)
    Workflow.objects.for_organization(org).all().delete()
    # Room for exactly one of the two (different names: the per-name lock does not serialize them).
    set_quota(org, max_definition_bytes_override=one + 1)
    barrier = threading.Barrier(2)
    outcomes: list[str] = []

    def apply(name: str) -> None:
        try:
            barrier.wait()
            apply_definition(organization=org, document={"name": name, "tasks": [task()]})
            outcomes.append("stored")
        except QuotaExceeded:
            outcomes.append("refused")
        finally:
            connections.close_all()

    threads = [threading.Thread(target=apply, args=(name,)) for name in ("probe", "other")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(outcomes) == ["refused", "stored"]
    assert Workflow.objects.for_organization(org).count() == 1


# --- the API ------------------------------------------------------------------------------------


@pytest.fixture
def api_factory(make_org):
    yield from new_api_factory(make_org)


@pytest.mark.django_db
def test_the_api_answers_an_apply_over_the_quota_with_a_422_problem_naming_it(api_factory):
    api = api_factory()
    document = doc(task())
    headers = bearer(api.keys[Role.ADMIN])
    first = api.client.post("/api/v1/workflows/", json.dumps(document), content_type="application/json",
                            headers=headers)
    assert first.status_code == 201, first.content
    one = stored_bytes(api.org)
    set_quota(api.org, max_definition_bytes_override=one)
    # A new version (an identical one is "unchanged" and stores nothing: 200, no quota used).
    changed = {**document, "description": "version 2"}
    response = api.client.post("/api/v1/workflows/", json.dumps(changed), content_type="application/json",
                               headers=headers)
    assert response.status_code == 422, response.content
    assert response["Content-Type"] == "application/problem+json"
    body = response.json()
    assert (body["code"], body["limit"], body["used"], body["allowed"]) == ("quota_exceeded", "max_definition_bytes",
                                                                            one, one)
    assert "max_definition_bytes" in body["detail"] and f"limit is {one} bytes" in body["detail"]
    assert Workflow.objects.for_organization(api.org).count() == 1
    # The identical document at the full quota: nothing new to store, so no refusal.
    same = api.client.post("/api/v1/workflows/", json.dumps(document), content_type="application/json",
                           headers=headers)
    assert same.status_code == 200 and same.json()["unchanged"] is True
    assert Workflow.objects.for_organization(api.org).count() == 1


@pytest.mark.django_db
def test_the_api_names_a_trailing_newline_or_a_float_in_a_400(api_factory):
    api = api_factory()
    for document, path, message in [
        ({"name": "nlname\n", "tasks": [task("a")]}, "name",
         "'nlname\\n': use 1-200 letters, digits, '_', '-' or '.', starting with a letter or digit"),
        (doc(task("a\n")), "tasks[0].key", "'a\\n' is not a valid key: use 1-100 letters, digits, '_', '-' or '.'"),
        (doc(task(concurrency={"key": "k\n", "limit": 3})), "tasks[charge].concurrency.key",
         "'k\\n': '\\n' not allowed; use letters, digits, '_', '.', ':' or '-'"),
        (doc(task(priority=2.0)), "tasks[charge].priority", "must be a whole number from -10 to 10, got 2.0"),
        (doc(task(), concurrency={"policy": "cancel_oldest"}), "concurrency.policy",
         "policy applies only with max_running_runs; 'cancel_oldest' without it would do nothing"),
    ]:
        response = api.client.post("/api/v1/workflows/", json.dumps(document), content_type="application/json",
                                   headers=bearer(api.keys[Role.ADMIN]))
        assert response.status_code == 400, response.content
        assert {"path": path, "message": message} in response.json()["errors"], response.json()
    assert Workflow.objects.for_organization(api.org).count() == 0


@pytest.mark.django_db
def test_the_api_names_a_bad_scheduling_field_in_a_400(api_factory):
    api = api_factory()
    response = api.client.post(
        "/api/v1/workflows/", json.dumps(doc(task(concurrency={"key": "stripe", "limit": 0}))),
        content_type="application/json", headers=bearer(api.keys[Role.ADMIN]))
    assert response.status_code == 400, response.content
    assert {"path": "tasks[charge].concurrency.limit", "message": "must be at least 1, got 0"} in response.json()[
        "errors"]
    assert Workflow.objects.for_organization(api.org).count() == 0


# --- other input-facing patterns anchored at the end ---------------------------------------------


@pytest.mark.django_db
def test_an_organization_slug_with_a_trailing_newline_is_refused(org):
    from tenancy.models import Membership
    from tenancy.services import TenancyError, create_organization_for

    owner = Membership.objects.for_organization(org).get(role=Role.OWNER).user
    with pytest.raises(TenancyError, match="use 1-63 lowercase letters"):
        create_organization_for(user=owner, slug="acme\n", name="Acme")
    assert not Organization.objects.filter(slug__startswith="acme").exists()


def test_an_api_key_with_a_trailing_newline_does_not_parse():
    from tenancy.apikeys import parse_key

    raw = "ffk_abcdefghijkl_" + "A" * 43
    assert parse_key(raw) == ("abcdefghijkl", "A" * 43)
    assert parse_key(raw + "\n") is None


# --- a key the input schema cannot fill ------------------------------------------------------------

CLOSED = {"type": "object", "properties": {"region": {"type": "string"},
                                           "customer": {"type": "object", "properties": {"id": {"type": "string"}},
                                                        "additionalProperties": False}},
          "required": ["region"], "additionalProperties": False}


@pytest.mark.parametrize(("template", "message"), [
    ("region-{{ input.regoin }}", "{{ input.regoin }} can never be filled: the input_schema allows no field "
     "'regoin' in input (additionalProperties is false; its properties: customer, region)"),
    ("c-{{ input.customer.name }}", "{{ input.customer.name }} can never be filled: the input_schema allows no "
     "field 'name' in input.customer (additionalProperties is false; its properties: id)"),
    ("r-{{ input.region.code }}", "{{ input.region.code }} can never be filled: the input_schema makes "
     "input.region string, which has no field 'code'"),
])
@pytest.mark.django_db
def test_a_key_that_no_input_the_schema_accepts_can_fill_is_refused_and_nothing_stored(org, template, message):
    document = doc(task("pull", concurrency={"key": template, "limit": 2}), input_schema=CLOSED)
    with pytest.raises(DefinitionError) as excinfo:
        validate_document(document)
    assert excinfo.value.errors == [{"path": "tasks[pull].concurrency.key", "message": message}]
    with pytest.raises(DefinitionError):
        apply_definition(organization=org, document=document)
    assert not Workflow.objects.for_organization(org).filter(name="charges").exists()


@pytest.mark.parametrize(("schema", "template"), [
    (CLOSED, "region-{{ input.region }}:{{ input.customer.id }}"),  # declared fields
    ({"type": "object", "properties": {"region": {"type": "string"}}}, "c-{{ input.other }}"),  # others allowed
    ({"type": "object", "patternProperties": {"^c": {}}, "additionalProperties": False}, "c-{{ input.cid }}"),
    ({"type": "object", "anyOf": [{"properties": {"x": {}}}], "additionalProperties": False}, "{{ input.x }}"),
])
def test_a_key_the_schema_allows_or_cannot_rule_out_is_accepted(schema, template):
    normalized = validate_document(doc(task("pull", concurrency={"key": template, "limit": 2}), input_schema=schema))
    assert normalized["tasks"][0]["concurrency"]["key"] == template
