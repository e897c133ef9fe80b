"""Routes of workflows, triggers, API keys and organization settings."""

urlpatterns: list = []
