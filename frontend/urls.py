"""Frontend routes: the dashboard, organizations, members and invitations."""

from django.urls import path

from frontend.views import home, invitations, members, orgs

app_name = "frontend"

urlpatterns = [
    path("", home.home, name="home"),
    path("home/live/", home.home_live, name="home_live"),
    path("live/runs/stream/", home.org_stream, name="org_stream"),
    path("orgs/", orgs.organization_list, name="orgs"),
    path("orgs/new/", orgs.organization_create, name="org_new"),
    path("members/", members.member_list, name="members"),
    path("members/invite/", members.member_invite, name="member_invite"),
    path("members/leave/", members.member_leave, name="member_leave"),
    path("members/<uuid:membership_id>/role/", members.member_change_role, name="member_role"),
    path("members/<uuid:membership_id>/remove/", members.member_remove, name="member_remove"),
    path(
        "members/invitations/<uuid:invitation_id>/revoke/",
        members.invitation_revoke,
        name="invitation_revoke",
    ),
    path("invitations/<str:token>/", invitations.invitation_accept, name="invitation_accept"),
]

# Workflows, triggers, API keys and settings; runs and the audit log: each section owns its routes.
from frontend.urls_notifications import urlpatterns as _notifications  # noqa: E402
from frontend.urls_runs import urlpatterns as _runs  # noqa: E402
from frontend.urls_workflows import urlpatterns as _workflows  # noqa: E402

urlpatterns += _workflows + _runs + _notifications
