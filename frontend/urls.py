"""Frontend routes."""

urlpatterns: list = []
