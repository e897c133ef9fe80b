"""Routes of the notification pages (issue 19): webhook endpoints and their delivery log, and
the workflow page's failure-email toggle."""

from django.urls import path

from frontend.views import webhooks

urlpatterns: list = [
    path("webhooks/", webhooks.webhook_list, name="webhooks"),
    path("webhooks/<uuid:endpoint_id>/", webhooks.webhook_detail, name="webhook_detail"),
    path("webhooks/<uuid:endpoint_id>/rotate/", webhooks.webhook_rotate, name="webhook_rotate"),
    path("webhooks/<uuid:endpoint_id>/delete/", webhooks.webhook_delete, name="webhook_delete"),
    path("webhooks/<uuid:endpoint_id>/deliveries/<uuid:delivery_id>/", webhooks.webhook_delivery,
         name="webhook_delivery"),
    path("webhooks/<uuid:endpoint_id>/deliveries/<uuid:delivery_id>/replay/", webhooks.webhook_delivery_replay,
         name="webhook_delivery_replay"),
    path("workflows/<uuid:workflow_id>/failure-emails/", webhooks.workflow_failure_emails,
         name="workflow_failure_emails"),
]
