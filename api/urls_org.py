"""Routes of organization administration: API keys, members, invitations, triggers, audit events."""

from django.urls import path

from api import views_org as views

urlpatterns = [
    path("api-keys/", views.ApiKeyListView.as_view(), name="apikey-list"),
    path("api-keys/<uuid:pk>/revoke/", views.ApiKeyRevokeView.as_view(), name="apikey-revoke"),
]
