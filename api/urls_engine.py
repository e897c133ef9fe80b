"""Routes of workflows, runs and their events."""

from django.urls import path

from api import views_engine as views

urlpatterns = [
    path("workflows/", views.WorkflowListView.as_view(), name="workflow-list"),
    path("workflows/validate/", views.WorkflowValidateView.as_view(), name="workflow-validate"),
    path("workflows/<uuid:pk>/", views.WorkflowDetailView.as_view(), name="workflow-detail"),
    path("workflows/<uuid:pk>/versions/", views.WorkflowVersionsView.as_view(), name="workflow-versions"),
    path("workflows/<uuid:pk>/archive/", views.WorkflowArchiveView.as_view(), name="workflow-archive"),
    path("workflows/<uuid:pk>/restore/", views.WorkflowRestoreView.as_view(), name="workflow-restore"),
    path("runs/", views.RunListView.as_view(), name="run-list"),
    path("runs/<uuid:pk>/", views.RunDetailView.as_view(), name="run-detail"),
    path("runs/<uuid:pk>/cancel/", views.RunCancelView.as_view(), name="run-cancel"),
    path("runs/<uuid:pk>/retry/", views.RunRetryView.as_view(), name="run-retry"),
    path("runs/<uuid:run_id>/task-runs/<uuid:pk>/output/", views.RunTaskOutputView.as_view(),
         name="run-task-output"),
    path("runs/<uuid:pk>/events/", views.RunEventListView.as_view(), name="run-events"),
    path("runs/<uuid:pk>/events/stream/", views.RunEventStreamView.as_view(), name="run-event-stream"),
]
