"""Identity through django-allauth, driven through the real pages with the test client:
signup with email verification, Argon2 hashes, TOTP MFA with recovery codes, the login
rate limits and the admin login going through allauth."""

from __future__ import annotations

import random
import re
import time
import uuid

from allauth.account.models import EmailAddress
from allauth.mfa.models import Authenticator
from allauth.mfa.totp.internal.auth import format_hotp_value, hotp_value
from django.conf import settings
from django.contrib.auth import SESSION_KEY
from django.core import mail
from django.test import Client

from tenancy.models import User

PASSWORD = "correct horse battery staple 42"
CONFIRM_LINK_RE = re.compile(r"http://testserver(/accounts/confirm-email/[^/\s]+/)")


def unique_email(prefix: str = "user") -> str:
    """An address no earlier run used: allauth's per-address rate limits live in Redis
    for minutes and would otherwise leak from one test run into the next."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}@example.com"


def fresh_client() -> Client:
    """A client with its own client IP, so the per-IP rate limits (kept in the shared
    Redis cache) of one test never count another test's requests."""
    return Client(
        REMOTE_ADDR=f"10.{random.randint(0, 255)}.{random.randint(0, 255)}.{random.randint(1, 254)}"
    )


def signed_in_user_id(client: Client) -> str | None:
    return client.session.get(SESSION_KEY)


def sign_up(client: Client, email: str, *, next_url: str | None = None) -> str:
    """Sign up through /accounts/signup/ and return the confirmation path from the
    verification email (the last mail sent to ``email``)."""
    url = "/accounts/signup/" + (f"?next={next_url}" if next_url else "")
    resp = client.post(url, {"email": email, "password1": PASSWORD, "password2": PASSWORD})
    assert resp.status_code == 302, resp.content.decode()[:2000]
    assert resp["Location"] == "/accounts/confirm-email/"
    messages_to = [m for m in mail.outbox if m.to == [email]]
    assert messages_to, "no verification email was sent"
    match = CONFIRM_LINK_RE.search(messages_to[-1].body)
    assert match, messages_to[-1].body
    return match.group(1)


def sign_up_and_confirm(client: Client, email: str, *, next_url: str | None = None):
    """Sign up, follow the emailed link (GET shows the page, POST confirms). Returns
    the confirming POST's response; allauth signs the user in on confirmation."""
    link = sign_up(client, email, next_url=next_url)
    page = client.get(link)
    assert page.status_code == 200
    assert email in page.content.decode()
    return client.post(link)


def log_in(client: Client, email: str, password: str = PASSWORD):
    return client.post("/accounts/login/", {"login": email, "password": password})


def log_out(client: Client) -> None:
    resp = client.post("/accounts/logout/")
    assert resp.status_code == 302
    assert signed_in_user_id(client) is None


def current_totp_code(secret: str) -> str:
    """The code an authenticator app shows now, computed with allauth's own HOTP
    (allauth.mfa.totp.internal.auth.hotp_value over the current 30 s counter).

    MFA_TOTP_TOLERANCE is 0, so a code computed in the last second of a period could
    expire before the server checks it: wait for the next period in that case.
    """
    period = 30
    if period - time.time() % period < 2:
        time.sleep(period - time.time() % period + 0.1)
    return format_hotp_value(hotp_value(secret, int(time.time()) // period))


def test_argon2_is_the_first_hasher_and_new_passwords_use_it(db):
    assert settings.PASSWORD_HASHERS[0] == "django.contrib.auth.hashers.Argon2PasswordHasher"
    client = fresh_client()
    email = unique_email("argon")
    sign_up(client, email)
    user = User.objects.get(email=email)
    assert user.password.startswith("argon2$argon2id$")
    assert user.check_password(PASSWORD)


def test_signup_requires_email_verification_before_login(db):
    client = fresh_client()
    email = unique_email("verify")
    link = sign_up(client, email)
    user = User.objects.get(email=email)
    assert not EmailAddress.objects.get(user=user, email=email).verified
    # Mandatory verification: a password login before confirming does not sign in.
    other = fresh_client()
    resp = log_in(other, email)
    assert resp.status_code == 302 and resp["Location"] == "/accounts/confirm-email/"
    assert signed_in_user_id(other) is None

    page = client.get(link)
    assert page.status_code == 200
    assert "Confirm" in page.content.decode()
    assert not EmailAddress.objects.get(user=user).verified  # GET does not confirm
    resp = client.post(link)
    assert resp.status_code == 302
    assert EmailAddress.objects.get(user=user, email=email).verified
    assert signed_in_user_id(client) == str(user.pk)
    # No organization yet: the dashboard sends the new user to "create organization".
    assert client.get("/").url == "/orgs/new/"


def test_signup_verify_enrol_totp_and_log_in_with_a_code_or_a_recovery_code(db):
    client = fresh_client()
    email = unique_email("mfa")
    sign_up_and_confirm(client, email)
    user = User.objects.get(email=email)
    assert signed_in_user_id(client) == str(user.pk)

    # Enrolling a factor asks for the password again (signing in by the emailed link
    # is not a password authentication).
    resp = client.get("/accounts/2fa/totp/activate/")
    assert resp.status_code == 302
    assert resp["Location"] == "/accounts/reauthenticate/?next=%2Faccounts%2F2fa%2Ftotp%2Factivate%2F"
    resp = client.post(resp["Location"], {"password": PASSWORD})
    assert resp.status_code == 302 and resp["Location"] == "/accounts/2fa/totp/activate/"

    # Enrol TOTP: the page shows the secret (and a QR code); allauth keeps it in the session.
    page = client.get("/accounts/2fa/totp/activate/")
    assert page.status_code == 200
    secret = page.context["form"].secret
    assert secret == client.session["mfa.totp.secret"]
    assert secret in page.content.decode()
    enrol_code = current_totp_code(secret)
    refused = client.post(
        "/accounts/2fa/totp/activate/", {"code": format_hotp_value((int(enrol_code) + 1) % 10**6)}
    )
    assert refused.status_code == 200
    assert "Incorrect code." in refused.content.decode()
    assert not Authenticator.objects.filter(user=user).exists()
    resp = client.post("/accounts/2fa/totp/activate/", {"code": current_totp_code(secret)})
    assert resp.status_code == 302
    assert resp["Location"] == "/accounts/2fa/recovery-codes/"
    types = set(Authenticator.objects.filter(user=user).values_list("type", flat=True))
    assert types == {Authenticator.Type.TOTP, Authenticator.Type.RECOVERY_CODES}

    codes_page = client.get("/accounts/2fa/recovery-codes/")
    assert codes_page.status_code == 200
    recovery_codes = list(codes_page.context["unused_codes"])
    assert len(recovery_codes) == 10
    assert recovery_codes[0] in codes_page.content.decode()

    log_out(client)

    # Password first: allauth then asks for the second factor instead of signing in.
    resp = log_in(client, email)
    assert resp.status_code == 302 and resp["Location"] == "/accounts/2fa/authenticate/"
    assert signed_in_user_id(client) is None
    prompt = client.get("/accounts/2fa/authenticate/")
    assert prompt.status_code == 200
    assert "Two-Factor Authentication" in prompt.content.decode()

    good = current_totp_code(secret)
    wrong = format_hotp_value((int(good) + 1) % 10**6)
    resp = client.post("/accounts/2fa/authenticate/", {"code": wrong})
    assert resp.status_code == 200
    assert "Incorrect code." in resp.content.decode()
    assert signed_in_user_id(client) is None

    resp = client.post("/accounts/2fa/authenticate/", {"code": good})
    assert resp.status_code == 302
    assert signed_in_user_id(client) == str(user.pk)

    # A recovery code signs in once...
    log_out(client)
    assert log_in(client, email)["Location"] == "/accounts/2fa/authenticate/"
    resp = client.post("/accounts/2fa/authenticate/", {"code": recovery_codes[0]})
    assert resp.status_code == 302
    assert signed_in_user_id(client) == str(user.pk)
    rc = Authenticator.objects.get(user=user, type=Authenticator.Type.RECOVERY_CODES).wrap()
    assert recovery_codes[0] not in rc.get_unused_codes()
    assert len(rc.get_unused_codes()) == 9

    # ...and is refused the second time.
    log_out(client)
    assert log_in(client, email)["Location"] == "/accounts/2fa/authenticate/"
    resp = client.post("/accounts/2fa/authenticate/", {"code": recovery_codes[0]})
    assert resp.status_code == 200
    assert "Incorrect code." in resp.content.decode()
    assert signed_in_user_id(client) is None


def test_password_change_and_reset_pages_work(db):
    client = fresh_client()
    email = unique_email("pw")
    sign_up_and_confirm(client, email)
    new_password = "another long passphrase 77"
    resp = client.post(
        "/accounts/password/change/",
        {"oldpassword": PASSWORD, "password1": new_password, "password2": new_password},
    )
    assert resp.status_code == 302
    assert User.objects.get(email=email).check_password(new_password)
    log_out(client)

    mail.outbox.clear()
    resp = client.post("/accounts/password/reset/", {"email": email})
    assert resp.status_code == 302 and resp["Location"] == "/accounts/password/reset/done/"
    assert len(mail.outbox) == 1 and mail.outbox[0].to == [email]
    link = re.search(r"http://testserver(/accounts/password/reset/key/\S+/)", mail.outbox[0].body).group(1)
    page = client.get(link, follow=True)  # allauth moves the key into the session, then shows the form
    assert page.status_code == 200
    final = "third passphrase for reset 31"
    resp = client.post(page.redirect_chain[-1][0], {"password1": final, "password2": final})
    assert resp.status_code == 302
    assert User.objects.get(email=email).check_password(final)


def test_allauth_pages_render_in_the_product_layout(db):
    client = fresh_client()
    page = client.get("/accounts/login/")
    body = page.content.decode()
    assert page.status_code == 200
    assert 'href="/static/frontend/app.css"' in body
    assert 'class="site-header"' in body
    # No inline script: every <script> loads a file from this site, with the CSP nonce.
    scripts = re.findall(r"<script\b[^>]*>(.*?)</script>", body, flags=re.S)
    assert all(content.strip() == "" for content in scripts)
    assert all('src="/static/' in tag and "nonce=" in tag for tag in re.findall(r"<script\b[^>]*>", body))
    email = unique_email("layout")
    sign_up_and_confirm(client, email)
    for url in ("/accounts/email/", "/accounts/password/change/", "/accounts/2fa/"):
        body = client.get(url).content.decode()
        assert 'class="site-header"' in body, url
        assert email in body, url  # the header shows the signed-in user
        assert 'aria-label="Account settings"' in body, url


def test_failed_logins_for_one_address_are_rate_limited(db):
    """ACCOUNT_RATE_LIMITS login_failed "5/5m/key": the sixth attempt for the address is
    refused with allauth's form error, even with the right password."""
    client = fresh_client()
    email = unique_email("brute")
    sign_up_and_confirm(client, email)
    log_out(client)

    attacker = fresh_client()
    for _ in range(5):
        resp = log_in(attacker, email, "wrong password")
        assert resp.status_code == 200
        assert "The email address and/or password you specified are not correct." in resp.content.decode()
    resp = log_in(attacker, email)
    assert resp.status_code == 200
    assert "Too many failed login attempts. Try again later." in resp.content.decode()
    assert signed_in_user_id(attacker) is None
    # The limit is per address: another IP gets the same answer for this address.
    resp = log_in(fresh_client(), email)
    assert "Too many failed login attempts. Try again later." in resp.content.decode()


def test_login_posts_from_one_ip_are_rate_limited_with_429(db):
    """ACCOUNT_RATE_LIMITS login "30/m/ip": the 31st login POST in a minute is a 429."""
    client = fresh_client()
    statuses = [log_in(client, unique_email("nobody"), "x").status_code for _ in range(31)]
    assert statuses[:30] == [200] * 30
    assert statuses[30] == 429


def test_admin_login_goes_through_allauth(db):
    client = fresh_client()
    resp = client.get("/admin/")
    assert resp.status_code == 302 and resp["Location"] == "/admin/login/?next=/admin/"
    resp = client.get("/admin/login/?next=/admin/")
    assert resp.status_code == 302
    assert resp["Location"] == "/accounts/login/?next=%2Fadmin%2F"

    email = unique_email("staff")
    sign_up_and_confirm(client, email)
    User.objects.filter(email=email).update(is_staff=True, is_superuser=True)
    log_out(client)
    resp = client.post("/accounts/login/?next=/admin/", {"login": email, "password": PASSWORD})
    assert resp.status_code == 302 and resp["Location"] == "/admin/"
    assert client.get("/admin/").status_code == 200
    # A signed-in staff member on /admin/login/ goes on to the admin.
    resp = client.get("/admin/login/?next=/admin/")
    assert resp.status_code == 302 and resp["Location"] == "/admin/"


def test_admin_login_refuses_a_signed_in_non_staff_user(db):
    client = fresh_client()
    sign_up_and_confirm(client, unique_email("plain"))
    assert client.get("/admin/login/").status_code == 403
    # The admin's own password form is gone: a POST to it does not sign anyone in.
    other = fresh_client()
    resp = other.post("/admin/login/", {"username": "x@example.com", "password": "y"})
    assert resp.status_code == 302 and resp["Location"].startswith("/accounts/login/")
