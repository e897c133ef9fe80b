from django.apps import AppConfig


class EngineConfig(AppConfig):
    name = "engine"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from engine import signals  # noqa: F401  (connects the receivers of tenancy's hooks)
