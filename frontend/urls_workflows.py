"""Routes of workflows, triggers, API keys, secrets and organization settings."""

from django.urls import path

from frontend.views import apikeys, secrets, settings, trigger_detail, triggers, workflow_grid, workflows

urlpatterns: list = [
    path("workflows/", workflows.workflow_list, name="workflows"),
    path("workflows/new/", workflows.workflow_new, name="workflow_new"),
    path("workflows/<uuid:workflow_id>/", workflows.workflow_detail, name="workflow_detail"),
    path("workflows/<uuid:workflow_id>/grid/", workflow_grid.workflow_grid, name="workflow_grid"),
    path("workflows/<uuid:workflow_id>/start/", workflows.workflow_start, name="workflow_start"),
    path("workflows/<uuid:workflow_id>/archive/", workflows.workflow_archive, name="workflow_archive"),
    path("workflows/<uuid:workflow_id>/restore/", workflows.workflow_restore, name="workflow_restore"),
    path("triggers/", triggers.trigger_list, name="triggers"),
    path("triggers/new/", triggers.trigger_new, name="trigger_new"),
    path("triggers/preview/", triggers.trigger_preview, name="trigger_preview"),
    path("triggers/<uuid:trigger_id>/", trigger_detail.trigger_detail, name="trigger_detail"),
    path("triggers/<uuid:trigger_id>/backfill/", trigger_detail.trigger_backfill, name="trigger_backfill"),
    path("triggers/<uuid:trigger_id>/backfills/<uuid:backfill_id>/cancel/", trigger_detail.trigger_backfill_cancel,
         name="trigger_backfill_cancel"),
    path("triggers/<uuid:trigger_id>/edit/", triggers.trigger_edit, name="trigger_edit"),
    path("triggers/<uuid:trigger_id>/pause/", triggers.trigger_pause, name="trigger_pause"),
    path("triggers/<uuid:trigger_id>/resume/", triggers.trigger_resume, name="trigger_resume"),
    path("triggers/<uuid:trigger_id>/delete/", triggers.trigger_delete, name="trigger_delete"),
    path("api-keys/", apikeys.apikey_list, name="apikeys"),
    path("api-keys/<uuid:key_id>/revoke/", apikeys.apikey_revoke, name="apikey_revoke"),
    path("secrets/", secrets.secret_list, name="secrets"),
    path("secrets/<str:name>/rotate/", secrets.secret_rotate, name="secret_rotate"),
    path("secrets/<str:name>/delete/", secrets.secret_delete, name="secret_delete"),
    path("settings/", settings.organization_settings, name="settings"),
]
