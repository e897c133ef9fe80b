"""Routes of organization administration: API keys, members, invitations, triggers, audit events,
the organization's limits, secrets, webhook endpoints and their deliveries."""

from django.urls import path

from api import views_backfills, views_secrets, views_webhooks
from api import views_org as views

urlpatterns = [
    path("triggers/", views.TriggerListView.as_view(), name="trigger-list"),
    path("triggers/<uuid:pk>/", views.TriggerDetailView.as_view(), name="trigger-detail"),
    path("triggers/<uuid:pk>/pause/", views.TriggerPauseView.as_view(), name="trigger-pause"),
    path("triggers/<uuid:pk>/resume/", views.TriggerResumeView.as_view(), name="trigger-resume"),
    path("triggers/<uuid:pk>/backfills/", views_backfills.BackfillListView.as_view(), name="trigger-backfill-list"),
    path("triggers/<uuid:pk>/backfills/preview/", views_backfills.BackfillPreviewView.as_view(),
         name="trigger-backfill-preview"),
    path("triggers/<uuid:pk>/backfills/<uuid:backfill_pk>/", views_backfills.BackfillDetailView.as_view(),
         name="trigger-backfill-detail"),
    path("triggers/<uuid:pk>/backfills/<uuid:backfill_pk>/cancel/", views_backfills.BackfillCancelView.as_view(),
         name="trigger-backfill-cancel"),
    path("members/", views.MemberListView.as_view(), name="member-list"),
    path("members/<uuid:pk>/", views.MemberDetailView.as_view(), name="member-detail"),
    path("invitations/", views.InvitationListView.as_view(), name="invitation-list"),
    path("invitations/<uuid:pk>/revoke/", views.InvitationRevokeView.as_view(), name="invitation-revoke"),
    path("api-keys/", views.ApiKeyListView.as_view(), name="apikey-list"),
    path("api-keys/<uuid:pk>/revoke/", views.ApiKeyRevokeView.as_view(), name="apikey-revoke"),
    path("audit-events/", views.AuditEventListView.as_view(), name="auditevent-list"),
    path("org/limits/", views.OrganizationLimitsView.as_view(), name="org-limits"),
    path("secrets/", views_secrets.SecretListView.as_view(), name="secret-list"),
    path("secrets/<str:name>/", views_secrets.SecretDetailView.as_view(), name="secret-detail"),
    path("webhooks/", views_webhooks.WebhookListView.as_view(), name="webhook-list"),
    path("webhooks/<uuid:pk>/", views_webhooks.WebhookDetailView.as_view(), name="webhook-detail"),
    path("webhooks/<uuid:pk>/rotate-secret/", views_webhooks.WebhookRotateView.as_view(), name="webhook-rotate"),
    path("webhooks/<uuid:pk>/deliveries/", views_webhooks.WebhookDeliveryListView.as_view(),
         name="webhook-deliveries"),
    path("webhooks/<uuid:pk>/deliveries/<uuid:delivery_id>/", views_webhooks.WebhookDeliveryDetailView.as_view(),
         name="webhook-delivery-detail"),
    path("webhooks/<uuid:pk>/deliveries/<uuid:delivery_id>/replay/",
         views_webhooks.WebhookDeliveryReplayView.as_view(), name="webhook-delivery-replay"),
]
