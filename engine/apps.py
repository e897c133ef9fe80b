from django.apps import AppConfig


class EngineConfig(AppConfig):
    name = "engine"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The egress policy (security: http task SSRF): a malformed FLOWFORGE_EGRESS_ALLOW
        # stops the web, worker and clock at start-up, naming the entry, rather than
        # failing tasks (or a definition's validation) later.
        from django.core.exceptions import ImproperlyConfigured

        from engine import egress

        try:
            egress.allowed()
        except egress.EgressConfigError as exc:
            raise ImproperlyConfigured(str(exc)) from None
