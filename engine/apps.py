from django.apps import AppConfig


class EngineConfig(AppConfig):
    name = "engine"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Build the registry of task callables (FLOWFORGE_TASK_CALLABLES) in every process
        (web, worker, clock, manage.py): a bad entry raises ImproperlyConfigured naming it,
        so the process stops at start-up instead of failing tasks later."""
        from django.conf import settings

        from engine.handlers import callables

        callables.load(settings.FLOWFORGE_TASK_CALLABLES)
