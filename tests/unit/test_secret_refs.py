"""Secret references in task configs (issue 18, engine.secret_refs): their syntax and the
field path of a malformed one, the apply-time check of unknown secrets (nothing stored),
the http task's refusal of literal credentials, resolution when an attempt starts, and
redaction of every value used from what the attempt leaves behind — driven in the
pytest process (the real-worker scan is tests/integration/test_secrets_scan.py)."""

from __future__ import annotations

import json
import logging
import secrets as pysecrets

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from audit.models import AuditLog
from engine import secret_refs
from engine.definitions import DefinitionError, validate_document
from engine.handlers import REGISTRY, PermanentTaskError, TaskContext
from engine.handlers.http import ResolvedConfigError
from engine.models import Task, TaskRun, TaskRunEvent, Workflow
from engine.secret_refs import SecretReferenceError, SecretUnavailable, find_references, redact
from engine.services import apply_definition, archive_workflow, restore_workflow, start_run
from tenancy import vault
from tenancy.models import Membership, Role
from tests.echo_server import echo_server
from tests.unit.test_runtime_inprocess import broker, drive, quiet_heartbeater  # noqa: F401 (fixtures)
from tests.unit.test_web_workflows import actor_of, make_team


def new_value() -> str:
    return "sk_live_" + pysecrets.token_urlsafe(24)


def owner_actor(org):
    return actor_of(Membership.objects.for_organization(org).get(role=Role.OWNER))


def http_task(key="fetch", **config):
    return {"key": key, "type": "http", "config": {"url": "https://api.example.com/v1", **config}}


# --- syntax ----------------------------------------------------------------------------------------


def test_references_are_found_with_their_field_paths_in_document_order():
    config = {
        "url": "https://api.example.com/v1/items?key={{secrets.QUERY_KEY}}",
        "headers": {"Authorization": "Bearer {{ secrets.API_TOKEN }}", "X-Other": "plain"},
        "json": {"items": ["a", {"token": "{{  secrets.API_TOKEN  }}"}], "pair": "{{ secrets.A }}-{{ secrets._B2 }}",
                 "n": 3, "ok": True, "none": None},
    }
    assert find_references(config, "tasks[fetch].config") == [
        ("tasks[fetch].config.url", "QUERY_KEY"),
        ("tasks[fetch].config.headers.Authorization", "API_TOKEN"),
        ("tasks[fetch].config.json.items[1].token", "API_TOKEN"),
        ("tasks[fetch].config.json.pair", "A"),
        ("tasks[fetch].config.json.pair", "_B2"),
    ]


@pytest.mark.parametrize("text", [
    "plain", "{{ input.customer }}", "{{ name }}", "{{ secretary }}", "{ secrets.X }", "{{secret_sauce}}", "",
])
def test_other_text_and_other_templates_are_not_references(text):
    assert find_references({"v": text}, "config") == []
    assert not secret_refs.has_reference(text)


@pytest.mark.parametrize("text, why", [
    ("{{ secrets.bad-name }}", "'bad-name' is not a secret name"),
    ("{{ secret.API_TOKEN }}", "write secrets (plural, lower case)"),
    ("{{ SECRETS.API_TOKEN }}", "write secrets (plural, lower case)"),
    ("{{ secrets. }}", "the name is missing"),
    ("Bearer {{ secrets.API_TOKEN", "it is not closed with }}"),
    ("{{ secrets.API_TOKEN }", "it is not closed with }}"),
    ("{{ secrets API_TOKEN }}", "a dot goes between secrets and the name"),
    ("{{ secrets.9LIVES }}", "'9LIVES' is not a secret name"),
    ("{{ secrets.A B }}", "'A B' is not a secret name"),
    ("{{ secrets." + "A" * 65 + " }}", "is not a secret name"),
])
def test_a_malformed_reference_is_an_error_naming_its_field_path(text, why):
    config = {"headers": {"Authorization": text}, "json": {"fine": "{{ secrets.OK }}"}}
    with pytest.raises(SecretReferenceError) as caught:
        find_references(config, "tasks[fetch].config")
    (error,) = caught.value.errors
    assert error["path"] == "tasks[fetch].config.headers.Authorization"
    assert why in error["message"] and "write {{ secrets.NAME }}" in error["message"]
    collected: list = []
    assert find_references(config, "tasks[fetch].config", errors=collected) == [("tasks[fetch].config.json.fine",
                                                                                  "OK")]
    assert collected == caught.value.errors


def test_every_malformed_reference_is_listed_and_one_in_a_key_is_refused():
    config = {"a": ["{{ secret.X }}", "{{ secrets.Y"], "{{ secrets.KEY }}": "v"}
    with pytest.raises(SecretReferenceError) as caught:
        find_references(config, "c")
    assert [e["path"] for e in caught.value.errors] == ["c.{{ secrets.KEY }}", "c.a[0]", "c.a[1]"]
    assert "not in an object's keys" in caught.value.errors[0]["message"]


def test_placeholders_stand_in_for_references_where_a_value_is_checked():
    assert secret_refs.with_placeholders("https://{{ secrets.HOST }}/x?k={{secrets.K}}") == \
        "https://secret/x?k=secret"
    assert secret_refs.has_reference("Bearer {{ secrets.T }}") and not secret_refs.has_reference("Bearer abc")


# --- redaction -------------------------------------------------------------------------------------


def test_redact_replaces_every_value_in_any_string_of_any_json_value():
    value = "sk_live_abc123"
    obj = {"headers": {"Authorization": f"Bearer {value}"}, "list": [value, f"x{value}y{value}", 1, None, True],
           value: "as a key", "n": 42}
    assert redact(obj, [value]) == {
        "headers": {"Authorization": "Bearer [redacted]"}, "list": ["[redacted]", "x[redacted]y[redacted]", 1, None,
                                                                    True],
        "[redacted]": "as a key", "n": 42}
    assert obj["list"][0] == value  # a copy: the input is untouched
    assert redact(f"GET /?k={value} failed", [value]) == "GET /?k=[redacted] failed"


def test_redact_recognizes_json_escaped_and_url_encoded_forms_and_replaces_longest_first():
    quoted = 'pa"ss\\wörd/+&='
    body_text = json.dumps({"echo": quoted})  # the value inside JSON text, as a text body holds it
    url_text = "https://x/?k=pa%22ss%5Cw%C3%B6rd%2F%2B%26%3D and pa%22ss%5Cw%C3%B6rd%2F%2B%26%3D"
    assert quoted not in redact(body_text, [quoted]) and "[redacted]" in redact(body_text, [quoted])
    assert json.dumps(quoted, ensure_ascii=True)[1:-1] not in redact(json.dumps(quoted), [quoted])
    assert redact(url_text, [quoted]) == "https://x/?k=[redacted] and [redacted]"
    # urllib.parse.quote's default leaves "/" alone: quote(v) is recognized too.
    assert redact("a=pa%22ss%5Cw%C3%B6rd/%2B%26%3D", [quoted]) == "a=[redacted]"
    assert redact("tokenABCD1234", ["tokenABCD", "tokenABCD1234"]) == "[redacted]"
    assert redact({"pin": 987654, "other": 12}, ["987654"]) == {"pin": "[redacted]", "other": 12}


@pytest.mark.parametrize("echoed", [
    "p%40ss%20w%2frd%3aS%c3%a9cret%2b1",  # lower-case hex (.NET's HttpUtility.UrlEncode)
    "p%40ss+w%2Frd%3AS%C3%A9cret%2B1",  # quote_plus
    "".join(f"%{b:02x}" for b in "p@ss w/rd:Sécret+1".encode()),  # every byte encoded
    "p@ss w\\/rd:S\\u00e9cret+1",  # PHP's json_encode escapes "/"
    "p@ss w/rd:S\\u00E9cret\\u002B1",  # System.Text.Json: upper-case \\u escapes, "+" escaped
    "p@ss w/rd:S%C3%A9cret\\u002b1",  # mixed within one value
])
def test_redact_recognizes_a_value_in_any_mix_of_percent_and_json_escapes_of_either_case(echoed):
    value = "p@ss w/rd:Sécret+1"
    assert redact(f"sent <{echoed}> ok", [value]) == "sent <[redacted]> ok"
    assert redact({"echo": echoed}, [value]) == {"echo": "[redacted]"}


def test_a_character_outside_the_bmp_is_recognized_as_its_json_surrogate_pair():
    assert redact("a \\ud83d\\ude00-key b", ["😀-key"]) == "a [redacted] b"


def test_short_values_are_redacted_too_and_empty_ones_ignored():
    assert redact("a-b-c", ["b"]) == "a-[redacted]-c"
    assert redact({"x": "text"}, ["", None]) == {"x": "text"}
    assert redact("text", []) == "text"


# --- definition time -------------------------------------------------------------------------------


def counts(org) -> tuple[int, int, int]:
    return (Workflow.objects.for_organization(org).count(), Task.objects.for_organization(org).count(),
            AuditLog.objects.for_organization(org).filter(action="workflow.version_created").count())


@pytest.mark.django_db
def test_an_unknown_secret_is_refused_at_apply_naming_the_field_and_nothing_is_stored(org):
    vault.set_secret(actor=owner_actor(org), name="KNOWN", value=new_value())
    before = counts(org)
    document = {"name": "calls", "tasks": [
        http_task(headers={"Authorization": "Bearer {{ secrets.KNOWN }}", "X-Api-Key": "{{ secrets.MISSING }}"}),
        {"key": "script", "type": "python", "config": {"callable": "tests.callables.echo",
                                                        "params": {"factor": "{{ secrets.ALSO_MISSING }}"}}},
    ]}
    with pytest.raises(DefinitionError) as caught:
        apply_definition(actor=owner_actor(org), document=document)
    assert [(e["path"], e["message"].split(":")[0]) for e in caught.value.errors] == [
        ("tasks[fetch].config.headers.X-Api-Key", "unknown secret 'MISSING'"),
        ("tasks[script].config.params.factor", "unknown secret 'ALSO_MISSING'"),
    ]
    assert counts(org) == before


@pytest.mark.django_db
def test_the_api_refuses_unknown_and_malformed_references_with_400_naming_the_path(org):
    client = Client()
    client.force_login(Membership.objects.for_organization(org).get(role=Role.OWNER).user)
    before = counts(org)
    for headers, path, words in [
        ({"Authorization": "Bearer {{ secrets.NOPE }}"}, "tasks[fetch].config.headers.Authorization",
         "unknown secret 'NOPE'"),
        ({"Authorization": "Bearer {{ secrets.bad-name }}"}, "tasks[fetch].config.headers.Authorization",
         "'bad-name' is not a secret name"),
    ]:
        document = {"name": "calls", "tasks": [http_task(headers=headers)]}
        for url in ("/api/v1/workflows/", "/api/v1/workflows/validate/"):
            response = client.post(url, json.dumps(document), content_type="application/json",
                                   headers={"X-Organization": org.slug})
            assert response.status_code == 400, response.content
            errors = response.json()["errors"]
            assert [e["path"] for e in errors] == [path] and words in errors[0]["message"], errors
    assert counts(org) == before


@pytest.mark.django_db
def test_a_known_reference_is_stored_as_written_and_shown_to_viewers_without_the_value(org):
    value = new_value()
    vault.set_secret(actor=owner_actor(org), name="API_TOKEN", value=value)
    workflow = apply_definition(actor=owner_actor(org), document={"name": "calls", "tasks": [
        http_task(url="https://api.example.com/v1?key={{ secrets.API_TOKEN }}",
                  headers={"Authorization": "Bearer {{ secrets.API_TOKEN }}"})]})
    task = Task.objects.for_organization(org).get(workflow=workflow)
    assert task.config["headers"] == {"Authorization": "Bearer {{ secrets.API_TOKEN }}"}
    assert task.config["url"] == "https://api.example.com/v1?key={{ secrets.API_TOKEN }}"
    viewer = make_team(org)["viewer"]
    client = Client()
    client.force_login(viewer.user)
    response = client.get(f"/api/v1/workflows/{workflow.pk}/", headers={"X-Organization": org.slug})
    assert response.status_code == 200
    assert "Bearer {{ secrets.API_TOKEN }}" in response.content.decode() and value not in response.content.decode()


@pytest.mark.parametrize("headers", [
    {"Authorization": "Bearer sk_live_123"}, {"authorization": "Basic dXNlcjpwYXNz"}, {"Cookie": "session=abc"},
    {"X-Api-Key": "k-123"}, {"x-api-key": "k-123"}, {"X-Auth-Token": "t-123"}, {"X-Access-Token": "t-123"},
    {"X-Client-Secret": "s-123"}, {"Ocp-Apim-Subscription-Key": "k-123"},
])
def test_an_http_task_refuses_a_literal_credential_header_in_a_new_definition(headers):
    with pytest.raises(DefinitionError) as caught:
        validate_document({"name": "calls", "tasks": [http_task(headers=headers)]})
    (error,) = caught.value.errors
    (name,) = headers
    assert error["path"] == f"tasks[fetch].config.headers.{name}"
    assert "literal credential: store it as a secret" in error["message"]
    assert "{{ secrets.NAME }}" in error["message"]


@pytest.mark.parametrize("url, named", [
    ("https://deploy:hunter22@api.example.com/v1", "literal password (user:password@)"),
    ("https://api.example.com/v1?api_key=k-123", "query parameter 'api_key'"),
    ("https://api.example.com/v1?q=x&access_token=t-1", "query parameter 'access_token'"),
    ("https://maps.example.com/v1?key=AIza123", "query parameter 'key'"),
    ("https://db.example.com/v1?user=a&pwd=x1", "query parameter 'pwd'"),
])
def test_an_http_task_refuses_a_literal_password_or_credential_query_parameter_in_its_url(url, named):
    with pytest.raises(DefinitionError) as caught:
        validate_document({"name": "calls", "tasks": [http_task(url=url)]})
    (error,) = caught.value.errors
    assert error["path"] == "tasks[fetch].config.url"
    assert named in error["message"] and "store it as a secret" in error["message"]


def test_a_url_taking_its_credentials_from_secrets_or_holding_none_passes():
    for url in ("https://deploy:{{ secrets.PW }}@api.example.com/v1", "https://deploy@api.example.com/v1",
                "https://api.example.com/v1?api_key={{ secrets.K }}&page=2&q=token"):
        assert validate_document({"name": "calls", "tasks": [http_task(url=url)]})["tasks"][0]["config"]["url"] == url


def test_proxy_authorization_stays_refused_as_a_hop_by_hop_header():
    with pytest.raises(DefinitionError, match="may not set 'Proxy-Authorization'"):
        validate_document({"name": "c", "tasks": [http_task(headers={"Proxy-Authorization": "{{ secrets.P }}"})]})


def test_credential_headers_that_reference_a_secret_and_other_headers_pass():
    normalized = validate_document({"name": "calls", "tasks": [http_task(headers={
        "Authorization": "Bearer {{ secrets.T }}", "Cookie": "sid={{ secrets.SID }}; theme=dark",
        "X-Api-Key": "{{secrets.K}}", "X-Request-Id": "literal is fine here"})]})
    assert normalized["tasks"][0]["config"]["headers"]["X-Api-Key"] == "{{secrets.K}}"


@pytest.mark.django_db
def test_a_stored_version_with_a_literal_credential_is_restored_and_runs(org, make_workflow):
    # A version stored before the rule: its definition written directly, as an upgrade finds it.
    workflow = make_workflow(org, [http_task(headers={"X-Request-Id": "1"})], name="legacy")
    legacy = {"name": "legacy", "description": "", "tasks": [
        {**http_task(headers={"Authorization": "Bearer old-literal"}), "depends_on": [], "max_attempts": 1,
         "retry_backoff_seconds": 1.0, "timeout_seconds": None}]}
    Workflow.objects.for_organization(org).filter(pk=workflow.pk).update(definition=legacy)
    Task.objects.for_organization(org).filter(workflow=workflow).update(config=legacy["tasks"][0]["config"])
    archive_workflow(actor=owner_actor(org), workflow=workflow, confirm="legacy")
    restored = restore_workflow(actor=owner_actor(org), workflow=Workflow.objects.for_organization(org).get(
        pk=workflow.pk))
    assert restored.state == "active"
    # ... while a new version of the same document is refused.
    with pytest.raises(DefinitionError, match="literal credential"):
        apply_definition(actor=owner_actor(org), document=legacy)


def test_a_url_with_references_is_checked_with_placeholders_and_again_once_resolved():
    http = REGISTRY["http"]
    config = http.validate_config({"url": "https://{{ secrets.HOST }}/v1?key={{ secrets.K }}"})
    assert config["url"] == "https://{{ secrets.HOST }}/v1?key={{ secrets.K }}"
    with pytest.raises(DefinitionError, match="must be an absolute http"):
        validate_document({"name": "c", "tasks": [http_task(url="ftp://{{ secrets.HOST }}/")]})
    resolved = {**config, "url": "not a url at all"}
    context = TaskContext(task_run_id=None, workflow_run_id=None, organization_id=None, task_key="t", attempt=1,
                          max_attempts=1, fencing_token=1, timeout_seconds=None, config=resolved, input={},
                          upstream={})
    with pytest.raises(ResolvedConfigError, match="the URL with its secret references resolved"):
        http.run(context)
    context.config = {**config, "url": "https://example.org/", "headers": {"X-Token": "a\r\nInjected: 1"}}
    with pytest.raises(Exception, match="may not contain CR, LF or NUL"):
        http.run(context)


# --- resolution ------------------------------------------------------------------------------------


@pytest.mark.django_db
def test_resolve_returns_a_copy_with_the_values_and_the_values_used(org):
    token, key = new_value(), new_value()
    vault.set_secret(actor=owner_actor(org), name="TOKEN", value=token)
    vault.set_secret(actor=owner_actor(org), name="KEY", value=key)
    config = {"headers": {"Authorization": "Bearer {{ secrets.TOKEN }}"},
              "json": ["{{ secrets.KEY }}:{{ secrets.TOKEN }}", 1], "url": "https://x/"}
    with CaptureQueriesContext(connection) as queries:
        resolved, values = secret_refs.resolve(org.pk, config)
    assert len(queries.captured_queries) == 1
    assert resolved == {"headers": {"Authorization": f"Bearer {token}"}, "json": [f"{key}:{token}", 1],
                        "url": "https://x/"}
    assert values == [token, key] and config["headers"]["Authorization"] == "Bearer {{ secrets.TOKEN }}"
    with CaptureQueriesContext(connection) as queries:
        assert secret_refs.resolve(org.pk, {"url": "https://x/"}) == ({"url": "https://x/"}, [])
    assert queries.captured_queries == []


@pytest.mark.django_db
def test_resolve_refuses_a_deleted_secret_for_good(org, make_org):
    vault.set_secret(actor=owner_actor(org), name="TOKEN", value=new_value())
    other = make_org()
    vault.set_secret(actor=owner_actor(other), name="ONLY_THERE", value=new_value())
    vault.delete_secret(actor=owner_actor(org), name="TOKEN")
    for name in ("TOKEN", "ONLY_THERE"):  # deleted, and another organization's
        with pytest.raises(SecretUnavailable) as caught:
            secret_refs.resolve(org.pk, {"headers": {"Authorization": f"Bearer {{{{ secrets.{name} }}}}"}})
        assert str(caught.value).startswith(f"secret {name} no longer exists (referenced at "
                                            "config.headers.Authorization)")
        assert isinstance(caught.value, PermanentTaskError)


# --- attempts, in process ----------------------------------------------------------------------------


def scan_database(value: str) -> list[str]:
    """The tables (and columns) where ``value`` appears as text."""
    found = []
    with connection.cursor() as cur:
        for table, column in [("core_taskrun", "output::text"), ("core_taskrun", "error"),
                              ("core_taskrunevent", "detail::text"), ("core_outboxmessage", "payload::text"),
                              ("core_auditlog", "metadata::text"), ("core_workflowrun", "error"),
                              ("core_workflowrun", "input::text"), ("core_task", "config::text"),
                              ("core_workflow", "definition::text"), ("core_secret", "ciphertext")]:
            cur.execute(f"SELECT count(*) FROM {table} WHERE strpos({column}, %s) > 0", [value])
            if cur.fetchone()[0]:
                found.append(f"{table}.{column}")
    return found


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker")
def test_an_attempt_sends_the_values_and_records_nothing_of_them(org, settings, caplog):
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.INFO, logger="httpx")  # whatever level an earlier test left it at
    token, key = new_value(), 'q"uote\\d/+' + pysecrets.token_urlsafe(8)
    vault.set_secret(actor=owner_actor(org), name="TOKEN", value=token)
    vault.set_secret(actor=owner_actor(org), name="KEY", value=key)
    with echo_server() as echo:
        workflow = apply_definition(actor=owner_actor(org), document={"name": "calls", "tasks": [
            {"key": "ok", "type": "http", "config": {
                "url": f"{echo.url}/echo?key={{{{ secrets.KEY }}}}", "method": "POST",
                "headers": {"Authorization": "Bearer {{ secrets.TOKEN }}"},
                "json": {"sent": "{{ secrets.TOKEN }}", "key": "{{ secrets.KEY }}"}}},
            {"key": "refused", "type": "http", "config": {
                "url": f"{echo.url}/status/500?key={{{{ secrets.KEY }}}}",
                "headers": {"X-Api-Key": "{{ secrets.TOKEN }}"}}},
            {"key": "script", "type": "python", "config": {
                "callable": "tests.callables.echo", "params": {"factor": "{{ secrets.TOKEN }}"}}},
            {"key": "boom", "type": "fail", "config": {"message": "it was {{ secrets.TOKEN }} and {{ secrets.KEY }}"}},
        ]})
        run = start_run(workflow=workflow, actor=owner_actor(org))
        drive(run.pk)

    # The server got the values: they were resolved when the attempts started.
    sent = {r["path"].split("?")[0]: r for r in echo.received}
    assert sent["/echo"]["headers"]["Authorization"] == f"Bearer {token}"
    assert json.loads(sent["/echo"]["body"]) == {"sent": token, "key": key}
    assert sent["/status/500"]["headers"]["X-Api-Key"] == token
    rows = {tr.task.key: tr for tr in TaskRun.objects.for_organization(org).filter(workflow_run=run)
            .select_related("task")}
    ok = rows["ok"].output["body"]
    assert rows["ok"].state == "succeeded"
    assert ok["headers"]["Authorization"] == "Bearer [redacted]"
    assert json.loads(ok["body"]) == {"sent": "[redacted]", "key": "[redacted]"}
    assert ok["path"] == "/echo?key=[redacted]"  # httpx percent-encoded it; that form is redacted too
    assert rows["script"].state == "succeeded" and rows["script"].output["factor"] == "[redacted]"
    assert rows["refused"].state == "failed" and "answered 500" in rows["refused"].error
    assert "[redacted]" in rows["refused"].error
    assert rows["boom"].state == "failed"
    assert rows["boom"].error == "RuntimeError: it was [redacted] and [redacted] (attempt 1)"
    events = TaskRunEvent.objects.for_organization(org).filter(workflow_run=run, kind="attempt_failed")
    assert "[redacted]" in json.dumps([e.detail for e in events])
    for value in (token, key, json.dumps(key)[1:-1]):
        assert scan_database(value) == [], value
        assert not [r for r in caplog.records if value in r.getMessage() or value in (r.exc_text or "")]
    # The log lines of the attempts are there, redacted (httpx's request lines, the failures).
    messages = [r.getMessage() for r in caplog.records]
    assert any("HTTP Request: POST" in m and "key=[redacted]" in m for m in messages), messages
    assert any("attempt 1 failed: RuntimeError: it was [redacted]" in m for m in messages)


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("broker")
def test_a_secret_deleted_after_apply_fails_the_attempt_for_good_naming_it(org):
    vault.set_secret(actor=owner_actor(org), name="TOKEN", value=new_value())
    workflow = apply_definition(actor=owner_actor(org), document={"name": "calls", "tasks": [
        {**http_task(headers={"Authorization": "Bearer {{ secrets.TOKEN }}"}), "max_attempts": 3}]})
    vault.delete_secret(actor=owner_actor(org), name="TOKEN")
    run = start_run(workflow=workflow, actor=owner_actor(org))
    drive(run.pk)
    (task_run,) = TaskRun.objects.for_organization(org).filter(workflow_run=run)
    assert (task_run.state, task_run.attempt) == ("failed", 1)  # not retried: another attempt fails alike
    assert task_run.error.startswith("SecretUnavailable: secret TOKEN no longer exists (referenced at "
                                     "config.headers.Authorization)")


def test_deeply_nested_values_are_resolved_and_redacted_without_recursion():
    deep: object = "{{ secrets.X }} and sk_live_deep_value"
    for _ in range(5000):
        deep = {"a": [deep]}
    assert [name for _path, name in find_references(deep, "c")] == ["X"]
    redacted = redact(deep, ["sk_live_deep_value"])
    for _ in range(5000):
        redacted = redacted["a"][0]
    assert redacted == "{{ secrets.X }} and [redacted]"
    substituted = secret_refs._substitute(deep, {"X": "value"})
    for _ in range(5000):
        substituted = substituted["a"][0]
    assert substituted == "value and sk_live_deep_value"


def test_what_a_cut_through_a_value_leaves_at_the_end_is_redacted_too():
    value = "sk_live_0123456789"
    assert secret_refs.redact_tail("token: sk_live_01", [value]) == "token: [redacted]"
    assert secret_refs.redact_tail("token: s", [value]) == "token: [redacted]"
    assert secret_refs.redact_tail("token: sk_live_0123456789", [value]) == "token: [redacted]"
    assert secret_refs.redact_tail("nothing of it at the end", [value]) == "nothing of it at the end"
    assert secret_refs.redact_tail("quoted \\\"pa", ['"pass"word']) == "quoted [redacted]"  # its JSON form
    assert secret_refs.redact_tail("naïve: pässw\ufffd", ["pässwört"]) == "naïve: [redacted]"  # a cut mid-character
    assert secret_refs.redact_tail("sk_live_01", []) == "sk_live_01"


@pytest.mark.django_db
def test_an_http_task_cuts_bodies_and_error_snippets_only_after_redacting(settings):
    """The body is cut at MAX_BODY_BYTES and an error quotes 500 characters of it: a cut
    through a value must not leave its first characters."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from engine.handlers.http import MAX_BODY_BYTES, HttpStatusError

    value = "sk_live_" + pysecrets.token_urlsafe(24)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            status = 200 if self.path == "/big" else 401
            filler = MAX_BODY_BYTES - 10 if self.path == "/big" else 490
            body = ("x" * filler + value + "y" * 100).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    settings.FLOWFORGE_EGRESS_ALLOW = ["127.0.0.1/32"]
    base = f"http://127.0.0.1:{httpd.server_address[1]}"
    http = REGISTRY["http"]
    try:
        def context(path):
            return TaskContext(task_run_id=None, workflow_run_id=None, organization_id=None, task_key="t", attempt=1,
                               max_attempts=1, fencing_token=1, timeout_seconds=None,
                               config=http.validate_config({"url": base + path}), input={}, upstream={},
                               secret_values=[value])

        out = http.run(context("/big"))
        assert out["truncated"] and out["body"].endswith("x[redacted]") and value[:5] not in out["body"]
        with pytest.raises(HttpStatusError) as caught:
            http.run(context("/denied"))
        assert value[:5] not in str(caught.value) and "x[redac" in str(caught.value)
    finally:
        httpd.shutdown()
        httpd.server_close()
