"""The dashboard: where a signed-in user lands."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from frontend.organization import organization_required
from tenancy.models import Membership


@require_GET
@organization_required
def home(request: HttpRequest) -> HttpResponse:
    membership = request.membership
    member_count = Membership.objects.for_organization(membership.organization).count()
    return render(request, "frontend/home.html", {"membership": membership, "member_count": member_count})
