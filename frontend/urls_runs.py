"""Routes of runs, the organization's own workers and the audit log."""

from django.urls import path

from frontend.views import audit, recovery, runs, tasks, workers

urlpatterns: list = [
    path("runs/", runs.run_list, name="run_list"),
    path("runs/<uuid:run_id>/", runs.run_detail, name="run_detail"),
    path("runs/<uuid:run_id>/live/", runs.run_live, name="run_live"),
    path("runs/<uuid:run_id>/stream/", runs.run_stream, name="run_stream"),
    path("runs/<uuid:run_id>/events/", runs.run_events, name="run_events"),
    path("runs/<uuid:run_id>/input/", tasks.run_input, name="run_input"),
    path("runs/<uuid:run_id>/tasks/<uuid:task_run_id>/", tasks.run_task, name="run_task"),
    path("runs/<uuid:run_id>/tasks/<uuid:task_run_id>/output/", runs.run_task_output, name="run_task_output"),
    path("runs/<uuid:run_id>/tasks/<uuid:task_run_id>/logs/", runs.run_task_logs, name="run_task_logs"),
    path("runs/<uuid:run_id>/cancel/", runs.run_cancel, name="run_cancel"),
    path("runs/<uuid:run_id>/retry/", runs.run_retry, name="run_retry"),
    path("runs/<uuid:run_id>/resume/", recovery.run_resume, name="run_resume"),
    path("runs/<uuid:run_id>/tasks/<uuid:task_run_id>/retry/", recovery.run_task_retry, name="run_task_retry"),
    path("runs/<uuid:run_id>/tasks/<uuid:task_run_id>/mark-succeeded/", recovery.run_task_mark_succeeded,
         name="run_task_mark_succeeded"),
    path("runs/<uuid:run_id>/tasks/<uuid:task_run_id>/skip/", recovery.run_task_skip, name="run_task_skip"),
    path("workers/", workers.worker_list, name="workers"),
    path("audit/", audit.audit_list, name="audit"),
]
