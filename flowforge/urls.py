"""Root URLconf: allauth's account pages, the admin (behind allauth's login), the
REST API under /api/v1/ and the server-rendered frontend."""

from allauth.account.decorators import secure_admin_login
from django.contrib import admin
from django.urls import include, path

# The admin's own login form would bypass allauth's rate limits and MFA: send staff
# through allauth's login instead (a signed-in non-staff user gets a 403).
admin.site.login = secure_admin_login(admin.site.login)

urlpatterns = [
    path("accounts/", include("allauth.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("api.urls")),
    path("", include("frontend.urls")),
]
