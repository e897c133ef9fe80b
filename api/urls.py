"""REST API v1 routes (mounted at /api/v1/ by flowforge.urls)."""

from api.urls_engine import urlpatterns as engine_patterns
from api.urls_org import urlpatterns as org_patterns

app_name = "api"

urlpatterns = engine_patterns + org_patterns
