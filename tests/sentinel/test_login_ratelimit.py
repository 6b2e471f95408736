"""The console's login behind the sign-in guard (sentinel.authentication): failures count per account
name as Django matches it and per client address, so variants of a name share one counter, and a
caller over the limit locks out only itself."""

import random
import time

import pytest
from django.test import Client, RequestFactory

from tests.conftest import unique

LOGIN = "/admin/login/"


def an_address() -> str:
    """A client address of the test's own (198.18.0.0/15, for benchmarks), so that tests running in
    the same minute never share a per-address counter."""
    return f"198.{random.randint(18, 19)}.{random.randint(0, 255)}.{random.randint(1, 254)}"


def full_width(name: str) -> str:
    return "".join(chr(ord(c) + 0xFEE0) for c in name)


def in_a_fresh_window(key: str, rate: str, needed: int = 30) -> None:
    """django-ratelimit counts in fixed windows (each key's offset by a hash of it): a run of tries
    that crosses its window's end starts counting afresh midway, and the try meant to be refused
    lands in a new window (a loaded host makes the 31 tries below take long enough). Waits until the
    key's window has `needed` seconds left."""
    from django_ratelimit.core import get_usage

    from sentinel.authentication import GROUP

    request = RequestFactory().post(LOGIN)
    usage = get_usage(request, group=GROUP, key=lambda group, req: key, rate=rate)
    if usage["time_left"] < needed:
        time.sleep(usage["time_left"] + 1)


def attempt(browser: Client, name: str, password: str) -> int:
    return browser.post(LOGIN, {"username": name, "password": password}).status_code


@pytest.mark.django_db
def test_repeated_failed_logins_are_throttled_per_account(django_user_model):
    username = unique("victim")
    django_user_model.objects.create_user(username, password="the right one", is_staff=True)
    browser = Client()

    assert [attempt(browser, username, "wrong") for _ in range(5)] == [200] * 5  # the form again, with an error
    refused = browser.post(LOGIN, {"username": username, "password": "wrong"})
    assert refused.status_code == 429
    assert 0 < int(refused["retry-after"]) <= 60 and "no-cache" in refused["cache-control"]
    assert attempt(browser, username, "the right one") == 429  # even the right password waits out the minute
    other = unique("bystander")
    django_user_model.objects.create_user(other, password="pw-pw-pw-pw", is_staff=True)
    assert attempt(browser, other, "pw-pw-pw-pw") == 302  # another account is not locked out


@pytest.mark.django_db
def test_variants_of_a_name_share_one_counter(django_user_model):
    """Django's login form strips the name and applies NFKC before matching it: ' victim', 'victim\\t'
    and its full-width letters are the same account, so they count as one."""
    username = unique("victim")
    django_user_model.objects.create_user(username, password="the right one", is_staff=True)
    assert attempt(Client(REMOTE_ADDR=an_address()), full_width(username) + " ", "the right one") == 302

    guesser = Client(REMOTE_ADDR=an_address())
    variants = [" " + username, username + " ", username + "\t", full_width(username), "\u3000" + username]
    assert [attempt(guesser, variant, "wrong") for variant in variants] == [200] * 5
    assert attempt(guesser, username, "the right one") == 429
    assert attempt(guesser, full_width(username), "the right one") == 429


@pytest.mark.django_db
def test_an_attacker_locks_out_only_their_own_address(django_user_model, settings):
    username = unique("victim")
    django_user_model.objects.create_user(username, password="the right one", is_staff=True)
    address = an_address()
    in_a_fresh_window(f"{address} {username}", settings.LOGIN_RATE_PER_USER)
    attacker = Client(REMOTE_ADDR=address)

    assert [attempt(attacker, username, "guess") for _ in range(6)] == [200] * 5 + [429]
    assert attempt(Client(REMOTE_ADDR=an_address()), username, "the right one") == 302  # the owner, elsewhere
    assert attempt(Client(REMOTE_ADDR="2001:db8:5::1"), username, "the right one") == 302


@pytest.mark.django_db
def test_one_address_guessing_across_names_is_stopped(django_user_model, settings):
    address = an_address()
    in_a_fresh_window(address, settings.LOGIN_RATE_PER_IP)
    sprayer = Client(REMOTE_ADDR=address)
    names = [unique("nobody") for _ in range(31)]
    assert [attempt(sprayer, name, "password1") for name in names] == [200] * 30 + [429]
    username = unique("someone")
    django_user_model.objects.create_user(username, password="pw-pw-pw-pw", is_staff=True)
    assert attempt(Client(REMOTE_ADDR=an_address()), username, "pw-pw-pw-pw") == 302  # other addresses are not


@pytest.mark.django_db
def test_successful_logins_count_against_nothing(django_user_model):
    username = unique("regular")
    django_user_model.objects.create_user(username, password="pw-pw-pw-pw", is_staff=True)
    address = an_address()
    assert {attempt(Client(REMOTE_ADDR=address), username, "pw-pw-pw-pw") for _ in range(8)} == {302}
