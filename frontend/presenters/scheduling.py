"""What the pages show of the scheduling settings (docs/scheduling.md): a task's
priority, concurrency key and limit, and rate limit; a workflow's concurrency block.

Each setting is a ``Setting`` of plain text (the templates escape it: keys are names a
user wrote). The words follow the definition document's fields, so what a page says can
be found in the YAML.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

# What a start over max_running_runs does, per policy (engine.models.RunLimitPolicy).
POLICY_WORDS = {
    "queue": "further runs wait (queue)",
    "cancel_newest": "a further run is cancelled (cancel_newest)",
    "cancel_oldest": "the oldest running run is cancelled (cancel_oldest)",
}


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: ``label`` ("priority", "concurrency", "rate limit", ...), ``code`` (a
    key or a number, shown as code; may be ""), ``detail`` (the rest, e.g. "limit 2")."""

    label: str
    code: str = ""
    detail: str = ""


def task_settings(task: Mapping[str, Any]) -> list[Setting]:
    """A task's scheduling settings, from a mapping with the Task columns ``priority``,
    ``concurrency_key``, ``concurrency_limit``, ``rate_key``, ``rate_limit`` and
    ``rate_window_seconds`` (frontend.dag.load_graph's dicts). A priority of 0 (the
    default) and unset limits are left out; [] when nothing is set."""
    out = []
    if task.get("priority"):
        out.append(Setting("priority", f"{task['priority']:+d}"))
    if task.get("concurrency_key") is not None:
        out.append(Setting("concurrency", task["concurrency_key"], f"limit {task['concurrency_limit']}"))
    if task.get("rate_key") is not None:
        window = "second" if task.get("rate_window_seconds") == 1 else "minute"
        out.append(Setting("rate limit", task["rate_key"], f"{task['rate_limit']} per {window}"))
    return out


def workflow_settings(workflow) -> list[Setting]:
    """A Workflow's concurrency block: its ``max_running_tasks``, its ``max_running_runs``
    with the policy for a start over it, or a policy set without a run limit (it then
    never applies). [] when the block is unset (no limit, the default policy)."""
    out = []
    if workflow.max_running_tasks is not None:
        out.append(Setting("max running tasks", str(workflow.max_running_tasks),
                           "task runs at once, every version"))
    policy = POLICY_WORDS.get(workflow.run_limit_policy, workflow.run_limit_policy)
    if workflow.max_running_runs is not None:
        out.append(Setting("max running runs", str(workflow.max_running_runs),
                           f"runs at once, every version; then {policy}"))
    elif workflow.run_limit_policy != "queue":
        out.append(Setting("policy", workflow.run_limit_policy, "no max running runs, so it never applies"))
    return out
