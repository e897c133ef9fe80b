"""Routes of workflows, runs and their events."""

from django.urls import path

from api import views_engine as views

urlpatterns = [
    path("workflows/", views.WorkflowListView.as_view(), name="workflow-list"),
    path("workflows/<uuid:pk>/", views.WorkflowDetailView.as_view(), name="workflow-detail"),
    path("runs/<uuid:pk>/", views.RunDetailView.as_view(), name="run-detail"),
    path("runs/<uuid:pk>/cancel/", views.RunCancelView.as_view(), name="run-cancel"),
]
