"""Routes of workflows, runs and their events."""

from django.urls import path

from api import views_recovery, views_runs, views_tasks, views_worker, views_workers, views_workflows

urlpatterns = [
    path("workflows/", views_workflows.WorkflowListView.as_view(), name="workflow-list"),
    path("workflows/validate/", views_workflows.WorkflowValidateView.as_view(), name="workflow-validate"),
    path("workflows/<uuid:pk>/", views_workflows.WorkflowDetailView.as_view(), name="workflow-detail"),
    path("workflows/<uuid:pk>/versions/", views_workflows.WorkflowVersionsView.as_view(), name="workflow-versions"),
    path("workflows/<uuid:pk>/archive/", views_workflows.WorkflowArchiveView.as_view(), name="workflow-archive"),
    path("workflows/<uuid:pk>/restore/", views_workflows.WorkflowRestoreView.as_view(), name="workflow-restore"),
    path("runs/", views_runs.RunListView.as_view(), name="run-list"),
    path("runs/<uuid:pk>/", views_runs.RunDetailView.as_view(), name="run-detail"),
    path("runs/<uuid:pk>/cancel/", views_runs.RunCancelView.as_view(), name="run-cancel"),
    path("runs/<uuid:pk>/retry/", views_runs.RunRetryView.as_view(), name="run-retry"),
    # What a person does about a failed run (engine.recovery): resume it, act on one task run.
    path("runs/<uuid:pk>/resume/", views_recovery.RunResumeView.as_view(), name="run-resume"),
    path("runs/<uuid:run_id>/task-runs/<uuid:pk>/retry/", views_recovery.TaskRunRetryView.as_view(),
         name="run-task-retry"),
    path("runs/<uuid:run_id>/task-runs/<uuid:pk>/mark-succeeded/", views_recovery.TaskRunMarkSucceededView.as_view(),
         name="run-task-mark-succeeded"),
    path("runs/<uuid:run_id>/task-runs/<uuid:pk>/skip/", views_recovery.TaskRunSkipView.as_view(),
         name="run-task-skip"),
    path("runs/<uuid:run_id>/task-runs/<uuid:pk>/", views_tasks.RunTaskDetailView.as_view(), name="run-task-detail"),
    path("runs/<uuid:run_id>/task-runs/<uuid:pk>/output/", views_runs.RunTaskOutputView.as_view(),
         name="run-task-output"),
    path("runs/<uuid:run_id>/task-runs/<uuid:pk>/logs/", views_workers.TaskRunLogsView.as_view(),
         name="run-task-logs"),
    path("runs/<uuid:pk>/events/", views_runs.RunEventListView.as_view(), name="run-events"),
    path("runs/<uuid:pk>/events/stream/", views_runs.RunEventStreamView.as_view(), name="run-event-stream"),
    # The organizations' own workers (docs/workers.md): worker keys only.
    path("worker/poll/", views_worker.WorkerPollView.as_view(), name="worker-poll"),
    path("worker/tasks/<uuid:pk>/heartbeat/", views_worker.WorkerHeartbeatView.as_view(), name="worker-heartbeat"),
    path("worker/tasks/<uuid:pk>/logs/", views_worker.WorkerLogsView.as_view(), name="worker-logs"),
    path("worker/tasks/<uuid:pk>/complete/", views_worker.WorkerCompleteView.as_view(), name="worker-complete"),
    path("worker/tasks/<uuid:pk>/fail/", views_worker.WorkerFailView.as_view(), name="worker-fail"),
    # The organization's workers and queues as its members see them (read).
    path("workers/", views_workers.WorkerListView.as_view(), name="worker-list"),
    path("queues/", views_workers.QueueListView.as_view(), name="queue-list"),
]
