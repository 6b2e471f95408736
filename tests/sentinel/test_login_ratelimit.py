"""django-ratelimit guards the console's login against brute force."""

import pytest
from django.test import Client

from tests.conftest import unique


@pytest.mark.django_db
def test_repeated_failed_logins_are_throttled_per_account(django_user_model):
    username = unique("victim")
    django_user_model.objects.create_user(username, password="the right one", is_staff=True)
    browser = Client()

    def attempt(name: str, password: str) -> int:
        return browser.post("/admin/login/", {"username": name, "password": password}).status_code

    assert [attempt(username, "wrong") for _ in range(5)] == [200] * 5  # the form again, with an error
    assert attempt(username, "wrong") == 429
    assert attempt(username, "the right one") == 429  # even the right password waits out the minute
    other = unique("bystander")
    django_user_model.objects.create_user(other, password="pw-pw-pw-pw", is_staff=True)
    assert attempt(other, "pw-pw-pw-pw") == 302  # another account is not locked out
