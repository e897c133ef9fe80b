"""The trigger pages: list with next firings in each trigger's zone, create and edit
with errors next to the field, the htmx schedule preview, pause/resume, delete after
a confirmation; viewers get no controls and a 403; another organization's trigger is
a 404; the list's query count does not grow with the number of triggers."""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

import pytest

from engine.models import ScheduledTrigger
from engine.services import apply_definition
from engine.triggers import create_trigger, set_enabled
from frontend.cron_words import describe_cron
from tests.unit.test_web_workflows import (
    DIAMOND,
    actions,
    actor_of,
    assert_csp_clean,
    client_for,
    make_team,
    sql_count,
    text,
)


@pytest.fixture
def team(org):
    return make_team(org)


@pytest.fixture
def workflow(team):
    return apply_definition(organization=team["org"], document=DIAMOND)


def make_trigger(team, name="nightly", cron="30 2 * * *", zone="Europe/Berlin", **extra) -> ScheduledTrigger:
    data = {"name": name, "workflow_name": "diamond", "cron_expression": cron, "timezone": zone, **extra}
    return create_trigger(actor=actor_of(team["owner"]), data=data)


def form_data(**overrides) -> dict:
    data = {
        "name": "hourly",
        "workflow_name": "diamond",
        "cron_expression": "0 * * * *",
        "timezone": "UTC",
        "input": "{}",
        "catch_up": "latest",
        "enabled": "on",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not None}


def field_errors(body: str, field: str) -> str:
    """The text of ``field``'s error list (empty when it has none)."""
    start = body.find(f'id="id_{field}_errors"')
    if start < 0:
        return ""
    return re.sub(r"<[^>]+>", "", body[start : body.index("</ul>", start)])


# --- list --------------------------------------------------------------------------------------


def test_list_shows_schedule_in_words_zone_next_firing_and_status(team, workflow):
    nightly = make_trigger(team)
    paused = make_trigger(team, name="weekdays", cron="0 9 * * 1-5", zone="America/New_York")
    set_enabled(actor=actor_of(team["owner"]), trigger=paused, enabled=False)
    nightly.refresh_from_db()
    local = nightly.next_fire_at.astimezone(ZoneInfo("Europe/Berlin"))

    resp = client_for(team["viewer"]).get("/triggers/")
    assert resp.status_code == 200
    body = text(resp)
    assert "nightly" in body and "<code>30 2 * * *</code>" in body
    assert "At 02:30 every day" in body and "(Europe/Berlin)" in body
    assert f"{local:%a} {local.day} {local:%b %Y}, 02:30 {local.tzname()}" in body
    assert f'<a href="/workflows/{workflow.pk}/">diamond</a>' in body
    assert "At 09:00 on Monday through Friday" in body
    assert (
        '<span class="badge ok">Enabled</span>' in body and '<span class="badge warn">Paused</span>' in body
    )
    # A viewer gets no buttons.
    for control in ("/pause/", "/resume/", "/edit/", "/delete/", "/triggers/new/"):
        assert control not in body, control
    assert_csp_clean(resp.content.decode())

    member = client_for(team["member"]).get("/triggers/").content.decode()
    assert (
        f'action="/triggers/{nightly.pk}/pause/"' in member
        and f'action="/triggers/{paused.pk}/resume/"' in member
    )
    assert (
        f'href="/triggers/{nightly.pk}/edit/"' in member
        and f'href="/triggers/{nightly.pk}/delete/"' in member
    )
    assert member.count("csrfmiddlewaretoken") >= 2


def test_list_query_count_does_not_grow_with_triggers(team, workflow):
    client = client_for(team["member"])
    make_trigger(team, name="t-0")
    few, _ = sql_count(client, "/triggers/")
    for i in range(1, 8):
        make_trigger(team, name=f"t-{i}", cron=f"{i} * * * *")
    many, resp = sql_count(client, "/triggers/")
    assert resp.content.decode().count("/pause/") == 8
    assert few == many, (few, many)


# --- create, edit ------------------------------------------------------------------------------


def test_create_form_previews_the_schedule_with_htmx(team, workflow):
    resp = client_for(team["member"]).get("/triggers/new/")
    assert resp.status_code == 200
    body = resp.content.decode()
    assert 'hx-get="/triggers/preview/"' in body
    assert "from:#id_cron_expression" in body and "from:#id_timezone" in body
    assert 'hx-include="#id_cron_expression, #id_timezone"' in body
    assert '<option value="diamond">diamond</option>' in body
    assert '<option value="Europe/Berlin">Europe/Berlin</option>' in body
    # The initial preview is rendered on the server (no JavaScript needed to see it).
    assert "Every hour, on the hour" in body and body.count("<li>") >= 5
    assert_csp_clean(body)


def test_preview_fragment_lists_the_next_five_firings_in_the_zone(team):
    client = client_for(team["viewer"])
    resp = client.get(
        "/triggers/preview/",
        {"cron_expression": "30 9 * * 1-5", "timezone": "Asia/Tokyo"},
        headers={"HX-Request": "true"},
    )
    assert resp.status_code == 200
    body = text(resp)
    assert "<html" not in body  # a fragment
    assert "At 09:30 on Monday through Friday" in body and "(Asia/Tokyo time)" in body
    times = re.findall(r"<li>(.*?)</li>", body)
    assert len(times) == 5
    assert all(t.endswith("09:30 JST") and t[:3] in {"Mon", "Tue", "Wed", "Thu", "Fri"} for t in times), times

    bad = text(client.get("/triggers/preview/", {"cron_expression": "61 * * * *", "timezone": "UTC"}))
    assert "is not a valid cron expression" in bad and "<li>" not in bad
    zone = text(
        client.get("/triggers/preview/", {"cron_expression": "* * * * *", "timezone": "Mars/Olympus"})
    )
    assert "'Mars/Olympus' is not an IANA time zone" in zone
    assert "Type a cron expression" in text(client.get("/triggers/preview/"))


def test_creating_a_trigger_stores_it_and_records_it(team, workflow):
    org = team["org"]
    resp = client_for(team["member"]).post(
        "/triggers/new/",
        form_data(
            name="berlin nightly",
            cron_expression="  0   3 * * * ",
            timezone="Europe/Berlin",
            input='{"limit": 3}',
            catch_up="skip",
        ),
    )
    assert resp.status_code == 302 and resp["Location"] == "/triggers/"
    trigger = ScheduledTrigger.objects.for_organization(org).get(name="berlin nightly")
    assert (trigger.cron_expression, trigger.timezone, trigger.input, trigger.catch_up, trigger.enabled) == (
        "0 3 * * *",
        "Europe/Berlin",
        {"limit": 3},
        "skip",
        True,
    )
    assert trigger.next_fire_at.astimezone(ZoneInfo("Europe/Berlin")).hour == 3
    assert trigger.created_by_id == team["member"].user_id
    [record] = actions(org, "trigger.created")
    assert record.target_id == str(trigger.pk)


@pytest.mark.parametrize(
    ("overrides", "field", "message"),
    [
        ({"cron_expression": "0 2 * *"}, "cron_expression", "must have 5 fields"),
        ({"cron_expression": "99 * * * *"}, "cron_expression", "is not a valid cron expression"),
        ({"timezone": "Mars/Olympus"}, "timezone", "Select a valid choice"),
        ({"input": "[1]"}, "input", "Run input must be a JSON object"),
        ({"input": "{oops"}, "input", "Run input is not valid JSON"),
        ({"workflow_name": "nope"}, "workflow_name", "Select a valid choice"),
        ({"name": ""}, "name", "This field is required."),
        # The API's and a definition's wording (engine.states.priority_problem).
        ({"priority": "11"}, "priority", "Must be a whole number from -10 to 10, got 11."),
        ({"priority": "-11"}, "priority", "Must be a whole number from -10 to 10, got -11."),
        ({"priority": "2.5"}, "priority", "Must be a whole number from -10 to 10, got '2.5'."),
    ],
)
def test_create_errors_are_shown_next_to_their_field_and_nothing_is_stored(
    team, workflow, overrides, field, message
):
    resp = client_for(team["member"]).post("/triggers/new/", form_data(**overrides))
    assert resp.status_code == 400
    assert message in field_errors(text(resp), field), text(resp)[:0]
    assert not ScheduledTrigger.objects.for_organization(team["org"]).exists()


def test_a_duplicate_name_is_an_error_on_the_name_field(team, workflow):
    make_trigger(team, name="hourly")
    resp = client_for(team["member"]).post("/triggers/new/", form_data(name="hourly"))
    assert resp.status_code == 400
    assert "A trigger named 'hourly' already exists" in field_errors(text(resp), "name")
    assert ScheduledTrigger.objects.for_organization(team["org"]).count() == 1


def test_editing_a_trigger_changes_it_and_records_the_change(team, workflow):
    trigger = make_trigger(team, input={"a": 1})
    client = client_for(team["member"])
    page = client.get(f"/triggers/{trigger.pk}/edit/")
    assert page.status_code == 200
    body = text(page)
    assert (
        'value="30 2 * * *"' in body
        and '<option value="Europe/Berlin" selected>' in body
        and '"a": 1' in body
    )
    assert "At 02:30 every day" in body

    resp = client.post(
        f"/triggers/{trigger.pk}/edit/",
        form_data(name="nightly", cron_expression="15 4 * * *", timezone="Europe/Berlin", input='{"a": 2}'),
    )
    assert resp.status_code == 302
    trigger.refresh_from_db()
    assert trigger.cron_expression == "15 4 * * *" and trigger.input == {"a": 2}
    assert trigger.next_fire_at.astimezone(ZoneInfo("Europe/Berlin")).strftime("%H:%M") == "04:15"
    [record] = actions(team["org"], "trigger.changed")
    assert record.metadata["changes"]["cron_expression"] == {"before": "30 2 * * *", "after": "15 4 * * *"}

    resp = client.post(f"/triggers/{trigger.pk}/edit/", form_data(name="nightly", cron_expression="bad"))
    assert resp.status_code == 400 and "must have 5 fields" in field_errors(text(resp), "cron_expression")


# --- pause, resume, delete ---------------------------------------------------------------------


def test_pause_resume_and_delete(team, workflow):
    org = team["org"]
    trigger = make_trigger(team)
    client = client_for(team["member"])
    assert client.post(f"/triggers/{trigger.pk}/pause/").status_code == 302
    trigger.refresh_from_db()
    assert not trigger.enabled
    assert "Paused nightly" in text(client.get("/triggers/"))
    assert client.post(f"/triggers/{trigger.pk}/resume/").status_code == 302
    trigger.refresh_from_db()
    assert trigger.enabled and trigger.next_fire_at > dt.datetime.now(dt.UTC)
    assert [len(actions(org, a)) for a in ("trigger.paused", "trigger.resumed")] == [1, 1]
    # Pausing and resuming are POST only.
    assert client.get(f"/triggers/{trigger.pk}/pause/").status_code == 405

    confirm = client.get(f"/triggers/{trigger.pk}/delete/")
    assert confirm.status_code == 200
    body = text(confirm)
    assert "Delete trigger nightly?" in body and f'action="/triggers/{trigger.pk}/delete/"' in body
    assert ScheduledTrigger.objects.for_organization(org).exists()  # GET changes nothing
    assert client.post(f"/triggers/{trigger.pk}/delete/").status_code == 302
    assert not ScheduledTrigger.objects.for_organization(org).exists()
    assert len(actions(org, "trigger.deleted")) == 1


def test_viewer_is_refused_every_change(team, workflow):
    trigger = make_trigger(team)
    client = client_for(team["viewer"])
    assert client.get("/triggers/new/").status_code == 403
    assert client.post("/triggers/new/", form_data()).status_code == 403
    assert client.get(f"/triggers/{trigger.pk}/edit/").status_code == 403
    assert client.post(f"/triggers/{trigger.pk}/edit/", form_data(name="x")).status_code == 403
    assert client.post(f"/triggers/{trigger.pk}/pause/").status_code == 403
    assert client.get(f"/triggers/{trigger.pk}/delete/").status_code == 403
    resp = client.post(f"/triggers/{trigger.pk}/delete/")
    assert resp.status_code == 403 and "may not do this: it needs workflow.edit, which only the owner, admin and member roles have" in text(resp)
    trigger.refresh_from_db()
    assert trigger.enabled and trigger.name == "nightly"
    assert ScheduledTrigger.objects.for_organization(team["org"]).count() == 1


def test_another_organizations_trigger_is_404(team, workflow, make_org):
    from tenancy.actors import Actor

    other = make_org()
    apply_definition(organization=other, document=DIAMOND)
    theirs = create_trigger(
        actor=Actor.system(other),
        data={
            "name": "theirs",
            "workflow_name": "diamond",
            "cron_expression": "0 * * * *",
            "timezone": "UTC",
        },
    )
    client = client_for(team["owner"])
    assert client.get(f"/triggers/{theirs.pk}/edit/").status_code == 404
    assert client.get(f"/triggers/{theirs.pk}/delete/").status_code == 404
    for action in ("edit", "pause", "resume", "delete"):
        assert client.post(f"/triggers/{theirs.pk}/{action}/", form_data(name="stolen")).status_code == 404
    theirs.refresh_from_db()
    assert theirs.enabled and theirs.name == "theirs"
    assert "theirs" not in client.get("/triggers/").content.decode()


def test_new_trigger_without_workflows_points_to_adding_one(team):
    body = text(client_for(team["member"]).get("/triggers/new/"))
    assert "There is no workflow to schedule yet" in body and "<form" not in body.split("<main")[1]
    assert "Add a workflow" in text(client_for(team["member"]).get("/triggers/"))


# --- cron in words -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "words"),
    [
        ("* * * * *", "Every minute"),
        ("*/15 * * * *", "Every 15 minutes"),
        ("0 * * * *", "Every hour, on the hour"),
        ("5 * * * *", "Every hour at 5 minutes past"),
        ("0 */6 * * *", "Every 6 hours, on the hour"),
        ("30 2 * * *", "At 02:30 every day"),
        ("30 9 * * 1-5", "At 09:30 on Monday through Friday"),
        ("0 8 * * mon,wed,fri", "At 08:00 on Monday, Wednesday and Friday"),
        ("0 7 * * 0", "At 07:00 on Sunday"),
        ("0 7 * * 7", "At 07:00 on Sunday"),
        ("0 9,17 * * *", "At 09:00 and 17:00 every day"),
        ("0 9-17 * * *", "Every hour from 09:00 through 17:00"),
        ("*/15 9-17 * * 1-5", "Every 15 minutes, 09:00 through 17:59, on Monday through Friday"),
        ("0 0 1 * *", "At 00:00 on day 1 of the month"),
        ("0 0 1,15 * *", "At 00:00 on days 1 and 15 of the month"),
        ("0 0 L * *", "At 00:00 on the last day of the month"),
        ("0 0 * jan-mar sun", "At 00:00 on Sunday in January through March"),
        ("0 12 1 * 1", "At 12:00 on day 1 of the month or on Monday"),
        ("not cron", ""),
    ],
)
def test_describe_cron_puts_common_patterns_into_words(expression, words):
    assert describe_cron(expression) == words


def test_describe_cron_falls_back_for_rare_patterns():
    described = describe_cron("0-30/5 1 * * *")
    assert described  # cron-descriptor's words when installed, else the fields named one by one
    try:
        import cron_descriptor  # noqa: F401
    except ImportError:
        assert described == "Minute 0-30/5, hour 1, day of month *, month *, day of week *"



@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"cron_expression": "99 * * * *"}, "'99 * * * *' is not a valid cron expression"),
        ({"cron_expression": "0 2 * *"}, "'0 2 * *' must have 5 fields (minute hour day month weekday)"),
        # Another field's error keeps the service from seeing the schedule: its error is
        # still shown, once, under the schedule field.
        ({"cron_expression": "99 * * * *", "name": ""}, "'99 * * * *' is not a valid cron expression"),
    ],
)
def test_an_invalid_cron_expression_is_shown_once_next_to_its_field(team, workflow, overrides, message):
    resp = client_for(team["member"]).post("/triggers/new/", form_data(**overrides))
    assert resp.status_code == 400
    body = text(resp)
    assert body.count(message) == 1, [line.strip() for line in body.splitlines() if message in line]
    assert message in field_errors(body, "cron_expression")
    assert "Correct the schedule" in body  # the preview points to the field instead
    assert not ScheduledTrigger.objects.for_organization(team["org"]).exists()
