"""Root URLconf: allauth's account pages, the admin (behind allauth's login), the
REST API under /api/v1/ with its OpenAPI schema and docs, and the server-rendered
frontend."""

from allauth.account.decorators import secure_admin_login
from django.contrib import admin
from django.shortcuts import redirect
from django.templatetags.static import static
from django.urls import include, path

from api.schema_views import SchemaView, docs_view
from flowforge import health

# The admin's own login form would bypass allauth's rate limits and MFA: send staff
# through allauth's login instead (a signed-in non-staff user gets a 403).
admin.site.login = secure_admin_login(admin.site.login)



def favicon(request):
    """Browsers ask for /favicon.ico whatever the page links: send them to the static icon."""
    return redirect(static("frontend/favicon.svg"), permanent=True)


urlpatterns = [
    path("favicon.ico", favicon),
    # Liveness, readiness (database, broker, migrations) and Prometheus metrics.
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", health.metrics, name="metrics"),
    path("accounts/", include("allauth.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("api.urls")),
    # The OpenAPI 3 schema of /api/v1/ (YAML; ?format=json for JSON) and Swagger UI over it.
    path("api/schema/", SchemaView.as_view(), name="api-schema"),
    path("api/docs/", docs_view(), name="api-docs"),
    path("", include("frontend.urls")),
]
