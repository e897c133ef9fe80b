"""REST API v1 routes."""

urlpatterns: list = []
