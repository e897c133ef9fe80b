"""Structured logs carry the ids of what they are about."""

from __future__ import annotations

import json
import logging

from pythonjsonlogger.json import JsonFormatter

from flowforge.dramatiq_middleware import LogContextMiddleware
from flowforge.logs import ContextFilter, bind, bound


def render(record_logger: str = "engine.worker.execute", msg: str = "attempt failed") -> dict:
    record = logging.LogRecord(record_logger, logging.WARNING, __file__, 1, msg, (), None)
    ContextFilter().filter(record)
    formatter = JsonFormatter("%(levelname)s %(name)s %(message)s %(organization_id)s %(workflow_run_id)s "
                              "%(task_run_id)s %(attempt)s %(fencing_token)s %(request_id)s")
    return json.loads(formatter.format(record))


def test_bound_ids_appear_on_json_lines_and_are_reset_after_the_block():
    with bound(task_run_id="tr-1", fencing_token=3):
        bind(organization_id="org-1", workflow_run_id="run-1", attempt=2)
        line = render()
        assert (line["task_run_id"], line["fencing_token"], line["organization_id"], line["workflow_run_id"],
                line["attempt"]) == ("tr-1", "3", "org-1", "run-1", "2")
    assert render()["task_run_id"] == "" and render()["organization_id"] == ""


def test_the_worker_middleware_binds_an_execute_message_and_resets_it():
    class Msg:
        actor_name = "execute_task_run"
        args = ("tr-9", 7)

    mw = LogContextMiddleware()
    mw.before_process_message(None, Msg())
    bind(attempt=1)
    assert (render()["task_run_id"], render()["fencing_token"], render()["attempt"]) == ("tr-9", "7", "1")
    mw.after_process_message(None, Msg())
    assert (render()["task_run_id"], render()["attempt"]) == ("", "")
