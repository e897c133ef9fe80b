from django.apps import AppConfig


class EngineConfig(AppConfig):
    name = "engine"
    default_auto_field = "django.db.models.BigAutoField"
