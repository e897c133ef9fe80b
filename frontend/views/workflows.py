"""Workflows: the list (latest version of each name), upload a definition, one
version's page (its DAG, tasks, versions, a diff against another version, archive
and restore, start a run).

Views parse and authorize, then call engine.services. Every id in a URL (and the
``?compare=`` id) is looked up in the active organization first, so another
organization's id is a 404 before any permission check; a refused action is a 403.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import uuid

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import Count, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from engine.access import access_workflow
from engine.definitions import DefinitionError
from engine.handlers import REGISTRY
from engine.models import ScheduledTrigger, Workflow, WorkflowRun, WorkflowState
from engine.notifications import failure_subscribed
from engine.reporting import task_count
from engine.services import (
    ConfirmationRequired,
    InvalidInput,
    InvalidStart,
    WorkflowNotStartable,
    apply_definition,
    archive_workflow,
    restore_workflow,
    start_run,
)
from engine.triggers import input_rejections
from frontend import input_form
from frontend.dag import graph_data, graph_order, load_graph
from frontend.forms_workflows import ArchiveForm, DefinitionForm
from frontend.organization import organization_required
from frontend.presenters.scheduling import task_settings, workflow_settings
from tenancy.limits import QuotaExceeded
from tenancy.models import without_credentials
from tenancy.permissions import Action, Forbidden, can, require

# Lines of a version diff shown before it is cut (a 5000-task definition is long).
MAX_DIFF_LINES = 2000
# Lines of either version's JSON above which no diff is computed: difflib's matching is
# worse than linear (about 1 s for 16,000 lines, 4 s for 64,000), and any viewer may ask.
MAX_DIFF_INPUT_LINES = 20_000
# Runs of this version listed on its page.
RECENT_RUNS = 8


def authorize(role: str | None, action: Action) -> None:
    """Raise PermissionDenied (the 403 page, with the reason) unless ``role`` may ``action``."""
    try:
        require(role, action)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None


def run_url(run_id) -> str:
    """The run's page (its routes belong to the runs section: a path, not a name)."""
    return f"/runs/{run_id}/"


def _workflow_or_404(request: HttpRequest, workflow_id: uuid.UUID) -> Workflow:
    """The active organization's workflow version, with its author (engine.access: a 404
    for a missing or foreign id)."""
    return access_workflow(request.membership.organization, workflow_id,
                           shape=lambda qs: without_credentials(qs, "created_by", "created_by_api_key"))


# --- list ---------------------------------------------------------------------------------------


@require_GET
@organization_required
def workflow_list(request: HttpRequest) -> HttpResponse:
    """The latest version of each workflow name, with its task count, number of
    versions and its latest run: one query whatever the number of workflows."""
    org = request.membership.organization
    versions = (
        Workflow.objects.for_organization(org)
        .filter(name=OuterRef("name"))
        .order_by()
        .values("name")
        .annotate(n=Count("id"))
        .values("n")
    )
    # The latest run of this (latest) version: idx_wfrun_wf_recent (workflow, created_at DESC), LIMIT 1.
    last_run = (
        WorkflowRun.objects.for_organization(org).filter(workflow=OuterRef("pk")).order_by("-created_at")
    )
    workflows = list(
        Workflow.objects.for_organization(org)
        .order_by("name", "-version")
        .distinct("name")
        .annotate(
            task_count=task_count(org),
            version_count=Coalesce(Subquery(versions), 0),
            last_run_id=Subquery(last_run.values("id")[:1]),
            last_run_state=Subquery(last_run.values("state")[:1]),
            last_run_at=Subquery(last_run.values("created_at")[:1]),
        )
    )
    context = {
        "organization": org,
        "workflows": workflows,
        "can_edit": can(request.actor.role, Action.WORKFLOW_EDIT),
    }
    return render(request, "frontend/workflows/list.html", context)


# --- new version --------------------------------------------------------------------------------


def _yaml_text(document: dict) -> str:
    """A definition as YAML for editing (key order kept, block style)."""
    import yaml

    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, default_flow_style=False, width=100)


@require_http_methods(["GET", "POST"])
@organization_required
def workflow_new(request: HttpRequest) -> HttpResponse:
    """Upload a definition: a new workflow, or the next version of an existing name.
    ``?from=<id>`` starts the editor from that version's definition."""
    org = request.membership.organization
    authorize(request.actor.role, Action.WORKFLOW_EDIT)
    base = None
    if request.method == "POST":
        form = DefinitionForm(request.POST, request.FILES)
        if form.is_valid():
            try:
                workflow = apply_definition(
                    document=form.cleaned_data["document"],
                    actor=request.actor,
                    state=form.cleaned_data["state"],
                    if_changed=True,
                )
            except Forbidden as exc:
                raise PermissionDenied(str(exc)) from None
            except DefinitionError as exc:
                form.set_definition_errors(exc.errors)
            except QuotaExceeded as exc:  # the organization's stored definitions quota
                form.add_error(None, str(exc))
            else:
                if workflow.unchanged:  # identical to the latest version: nothing stored
                    messages.info(request, f"Unchanged: {workflow.name} version {workflow.version} already has this "
                                           "definition, so no new version was created.")
                    return redirect("frontend:workflow_detail", workflow_id=workflow.pk)
                messages.success(
                    request, f"Saved {workflow.name} version {workflow.version} ({workflow.state})."
                )
                _warn_rejected_triggers(request, workflow)
                return redirect("frontend:workflow_detail", workflow_id=workflow.pk)
        status = 400
    else:
        initial = {}
        from_id = request.GET.get("from")
        if from_id:
            base = access_workflow(org, from_id)  # a 404 for a malformed, missing or foreign id
            document = dict(base.definition)
            if base.input_schema_json:  # its properties in the order written (jsonb sorts keys)
                document["input_schema"] = json.loads(base.input_schema_json)
            initial["definition"] = _yaml_text(document)
        form = DefinitionForm(initial=initial)
        status = 200
    context = {"form": form, "base": base, "task_types": sorted(REGISTRY)}
    return render(request, "frontend/workflows/new.html", context, status=status)


def _warn_rejected_triggers(request: HttpRequest, workflow: Workflow) -> None:
    """A warning for each cron trigger whose input the version just saved refuses (its
    firings will fail until the input is fixed; the trigger list shows it too)."""
    if workflow.state != WorkflowState.ACTIVE or not workflow.input_schema_json:
        return
    org = request.membership.organization
    affected = list(ScheduledTrigger.objects.for_organization(org).filter(workflow_name=workflow.name)
                    .order_by("name"))
    rejected = input_rejections(org, affected)
    for trigger in affected:
        found = rejected.get(trigger.pk)
        if found is not None:
            messages.warning(request, f"Trigger {trigger.name}: {found.message()}. Its firings will fail until its "
                             "input is changed.")


# --- one version --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class DiffLine:
    kind: str  # "file", "hunk", "add", "del", "ctx"
    text: str


def definition_diff(older: Workflow, newer: Workflow) -> tuple[list[DiffLine], bool]:
    """A unified diff of two versions' normalized definitions as indented, key-sorted
    JSON. Returns (lines, truncated). When either side is over MAX_DIFF_INPUT_LINES,
    no diff is computed: one "hunk" line says so."""

    def lines(wf: Workflow) -> list[str]:
        return json.dumps(wf.definition, indent=2, sort_keys=True, ensure_ascii=False).splitlines()

    old_lines, new_lines = lines(older), lines(newer)
    if max(len(old_lines), len(new_lines)) > MAX_DIFF_INPUT_LINES:
        return [DiffLine("hunk", f"Too large to compare here: {len(old_lines)} and {len(new_lines)} lines of JSON "
                                 f"(at most {MAX_DIFF_INPUT_LINES} each). Compare the two definitions offline.")], False
    out: list[DiffLine] = []
    for raw in difflib.unified_diff(
        old_lines,
        new_lines,
        fromfile=f"{older.name} v{older.version}",
        tofile=f"{newer.name} v{newer.version}",
        lineterm="",
        n=3,
    ):
        if raw.startswith(("---", "+++")) and len(out) < 2:
            kind = "file"
        elif raw.startswith("@@"):
            kind = "hunk"
        elif raw.startswith("+"):
            kind = "add"
        elif raw.startswith("-"):
            kind = "del"
        else:
            kind = "ctx"
        out.append(DiffLine(kind, raw))
        if len(out) >= MAX_DIFF_LINES:
            return out, True
    return out, False


def _render_detail(
    request: HttpRequest,
    workflow: Workflow,
    *,
    start_form: forms.Form | None = None,
    archive_form: ArchiveForm | None = None,
    status: int = 200,
) -> HttpResponse:
    org = request.membership.organization
    role = request.actor.role
    tasks, edges = load_graph(workflow)
    for t in tasks:
        t["scheduling"] = task_settings(t)
    versions = list(
        without_credentials(Workflow.objects.for_organization(org).filter(name=workflow.name),
                            "created_by", "created_by_api_key")
        .order_by("-version")
    )
    compare, diff, diff_truncated = None, None, False
    compare_id = request.GET.get("compare")
    if compare_id:
        try:
            wanted = uuid.UUID(compare_id)
        except ValueError:
            raise Http404("no such version") from None
        # Only versions of this name (already loaded); anything else is not found.
        compare = next((v for v in versions if v.pk == wanted), None)
        if compare is None:
            raise Http404("no such version")
        older, newer = sorted((compare, workflow), key=lambda w: w.version)
        diff, diff_truncated = definition_diff(older, newer)
    recent_runs = list(
        without_credentials(WorkflowRun.objects.for_organization(org).filter(workflow=workflow), "triggered_by")
        .order_by("-created_at")[:RECENT_RUNS]
    )
    can_run = can(role, Action.RUN_OPERATE)
    can_edit = can(role, Action.WORKFLOW_EDIT)
    context = {
        "workflow": workflow,
        "dag": graph_data(graph_order(tasks, edges), edges),
        "tasks": tasks,
        "any_scheduling": any(t["scheduling"] for t in tasks),
        "workflow_limits": workflow_settings(workflow),
        "edge_count": len(edges),
        "versions": versions,
        "latest": versions[0] if versions else workflow,
        "compare": compare,
        "diff": diff,
        "diff_truncated": diff_truncated,
        "recent_runs": recent_runs,
        "can_run": can_run,
        "can_edit": can_edit,
        # Generated from the version's input schema when it has one (frontend.input_form).
        "start_form": (start_form or input_form.start_form(workflow)) if can_run else None,
        "archive_form": (archive_form or ArchiveForm()) if can_edit else None,
        "is_active": workflow.state == WorkflowState.ACTIVE,
        # The signed-in member's own failure emails of this workflow's name (issue 19).
        "failure_emails": failure_subscribed(org, request.user, workflow.name),
    }
    return render(request, "frontend/workflows/detail.html", context, status=status)


@require_GET
@organization_required
def workflow_detail(request: HttpRequest, workflow_id: uuid.UUID) -> HttpResponse:
    return _render_detail(request, _workflow_or_404(request, workflow_id))


@require_POST
@organization_required
def workflow_start(request: HttpRequest, workflow_id: uuid.UUID) -> HttpResponse:
    """Start a run with the input of the form (the fields generated from the version's
    input schema, or its JSON textarea), then go to the run's page; a refused input is
    shown next to its fields."""
    workflow = _workflow_or_404(request, workflow_id)
    authorize(request.actor.role, Action.RUN_OPERATE)
    form = input_form.start_form(workflow, request.POST)
    if form.is_valid():
        try:
            run = start_run(workflow=workflow, run_input=input_form.input_of(form), actor=request.actor,
                            priority=form.cleaned_data.get("priority") or 0, claim_roots=True)
        except Forbidden as exc:
            raise PermissionDenied(str(exc)) from None
        except (WorkflowNotStartable, QuotaExceeded) as exc:
            form.add_error(None, str(exc))
        except InvalidInput as exc:  # the input schema refused it: each violation at its field
            input_form.add_violations(form, exc.violations)
        except InvalidStart as exc:  # a priority out of range, an input a concurrency key cannot use
            form.add_error(exc.field if exc.field in form.fields else None, exc.message)
        except ValueError as exc:  # not storable JSON (e.g. a NaN)
            form.add_error("input", str(exc))
        else:
            messages.success(request, f"Started a run of {workflow.name} v{workflow.version}.")
            return redirect(run_url(run.pk))
    return _render_detail(request, workflow, start_form=form, status=400)


@require_POST
@organization_required
def workflow_archive(request: HttpRequest, workflow_id: uuid.UUID) -> HttpResponse:
    """Archive this version (its running runs are cancelled) once its name is typed."""
    workflow = _workflow_or_404(request, workflow_id)
    authorize(request.actor.role, Action.WORKFLOW_EDIT)
    form = ArchiveForm(request.POST)
    form.is_valid()  # one optional text field: always valid
    try:
        archived, cancelled = archive_workflow(
            actor=request.actor, workflow=workflow, confirm=form.cleaned_data.get("confirm", "").strip()
        )
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    except ConfirmationRequired:
        form.add_error("confirm", f"Type {workflow.name} exactly to confirm.")
        return _render_detail(request, workflow, archive_form=form, status=400)
    note = f" {cancelled} running run{'s were' if cancelled != 1 else ' was'} cancelled." if cancelled else ""
    messages.success(request, f"Archived {archived.name} v{archived.version}.{note}")
    return redirect("frontend:workflow_detail", workflow_id=workflow.pk)


@require_POST
@organization_required
def workflow_restore(request: HttpRequest, workflow_id: uuid.UUID) -> HttpResponse:
    """Make an archived or draft version active again (after re-validating it)."""
    workflow = _workflow_or_404(request, workflow_id)
    authorize(request.actor.role, Action.WORKFLOW_EDIT)
    was = workflow.state
    try:
        restored = restore_workflow(actor=request.actor, workflow=workflow)
    except Forbidden as exc:
        raise PermissionDenied(str(exc)) from None
    except DefinitionError as exc:
        messages.error(
            request,
            f"{workflow.name} v{workflow.version} no longer validates, so it stays {was}: "
            + "; ".join(f"{e['path']}: {e['message']}" for e in exc.errors),
        )
    else:
        if was == WorkflowState.DRAFT:
            messages.success(
                request, f"Activated {restored.name} v{restored.version}; it can start runs now."
            )
        else:
            messages.success(
                request, f"Restored {restored.name} v{restored.version}; it can start runs again."
            )
    return redirect("frontend:workflow_detail", workflow_id=workflow.pk)
