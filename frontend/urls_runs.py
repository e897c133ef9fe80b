"""Routes of runs and the audit log."""

urlpatterns: list = []
