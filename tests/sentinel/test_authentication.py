"""HTTP Basic on the management API passes the same sign-in guard as the console's login: failures
count per account name (as Django matches it) and client address, and per address."""

import base64

from django.test import Client

from tests.conftest import unique
from tests.sentinel.test_login_ratelimit import an_address, full_width

URL = "/api/v1/reports/spend?start=2026-03-01&end=2026-03-01"


def basic(username: str, password: str) -> dict:
    return {"HTTP_AUTHORIZATION": "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()}


def test_repeated_failed_basic_sign_ins_are_throttled_per_account(tenancy):
    finance = tenancy.finance.username
    api = Client()

    assert [api.get(URL, **basic(finance, "wrong")).status_code for _ in range(5)] == [401] * 5
    refused = api.get(URL, **basic(finance, tenancy.password))
    assert refused.status_code == 429  # even the right password waits out the minute
    assert refused.json()["detail"].startswith("Too many failed sign-ins")
    assert 0 < int(refused["retry-after"]) <= 60
    assert api.get(URL, **basic(tenancy.owner.username, tenancy.password)).status_code == 200  # others are not


def test_successful_requests_are_not_counted(tenancy):
    api = Client()
    assert {api.get(URL, **basic(tenancy.owner.username, tenancy.password)).status_code for _ in range(12)} == {200}


def test_unknown_accounts_count_too(live_db):
    api = Client()
    ghost = unique("ghost")
    assert [api.get(URL, **basic(ghost, "x")).status_code for _ in range(6)] == [401] * 5 + [429]


def test_an_attacker_locks_out_only_their_own_address(tenancy):
    finance = tenancy.finance.username
    attacker, owner = Client(REMOTE_ADDR=an_address()), Client(REMOTE_ADDR=an_address())

    assert [attacker.get(URL, **basic(finance, "guess")).status_code for _ in range(6)] == [401] * 5 + [429]
    assert owner.get(URL, **basic(finance, tenancy.password)).status_code == 200


def test_variants_of_a_name_share_one_counter(tenancy):
    finance = tenancy.finance.username
    api = Client(REMOTE_ADDR=an_address())
    variants = [" " + finance, finance + "\t", full_width(finance), finance + " ", finance]
    assert [api.get(URL, **basic(variant, "wrong")).status_code for variant in variants] == [401] * 5
    assert api.get(URL, **basic(finance, tenancy.password)).status_code == 429
