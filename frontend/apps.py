from django.apps import AppConfig


class FrontendConfig(AppConfig):
    name = "frontend"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from frontend import checks  # registers the system checks frontend.W001 and W002

        checks.warn_if_mail_goes_to_console()
