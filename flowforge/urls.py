"""Root URLconf: allauth's account pages, the admin (behind allauth's login), the
REST API under /api/v1/ and the server-rendered frontend."""

from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("accounts/", include("allauth.urls")),
    path("admin/", admin.site.urls),
    path("api/v1/", include("api.urls")),
    path("", include("frontend.urls")),
]
