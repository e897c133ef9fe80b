"""REST API v1 routes (mounted at /api/v1/ by flowforge.urls)."""

from django.urls import path

from api import views

app_name = "api"

urlpatterns = [
    path("workflows/", views.WorkflowListView.as_view(), name="workflow-list"),
    path("workflows/<uuid:pk>/", views.WorkflowDetailView.as_view(), name="workflow-detail"),
    path("runs/<uuid:pk>/", views.RunDetailView.as_view(), name="run-detail"),
    path("runs/<uuid:pk>/cancel/", views.RunCancelView.as_view(), name="run-cancel"),
    path("api-keys/", views.ApiKeyListView.as_view(), name="apikey-list"),
    path("api-keys/<uuid:pk>/revoke/", views.ApiKeyRevokeView.as_view(), name="apikey-revoke"),
]
