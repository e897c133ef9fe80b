from django.apps import AppConfig


class EngineConfig(AppConfig):
    name = "engine"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        """Check the engine's security settings in every process (web, worker, clock,
        manage.py), so a bad one stops it at start-up instead of failing tasks later:

        - the registry of task callables (FLOWFORGE_TASK_CALLABLES): a bad entry raises
          ImproperlyConfigured naming it;
        - the egress policy (FLOWFORGE_EGRESS_ALLOW): a malformed entry raises
          ImproperlyConfigured naming it.

        It also connects the engine's receivers of tenancy's signals (engine.signals: a
        departed member's cron triggers are paused), and builds the Dramatiq broker
        (``flowforge.broker.setup``), so the web, the clock and the commands can send
        messages (engine.dispatch) and the worker's actors are declared on it.
        """
        from django.conf import settings
        from django.core.exceptions import ImproperlyConfigured

        from engine import (
            egress,
            signals,  # noqa: F401  (connects the receivers of tenancy's hooks)
        )
        from engine.handlers import callables
        from flowforge import broker

        callables.load(settings.FLOWFORGE_TASK_CALLABLES)
        try:
            egress.allowed()
        except egress.EgressConfigError as exc:
            raise ImproperlyConfigured(str(exc)) from None
        broker.setup()
