"""Big lists count their rows only up to CappedCountPaginator.CAP: a tenant with more keys than that
sees "more than 10000" and a "select all" that names no number; under the cap the count is exact."""

from __future__ import annotations

from django.db import connection

from sentinel.console.scoping import CappedCountPaginator
from tenants.models import VirtualKey
from tenants.services import key_create
from tests.conftest import unique
from tests.console.conftest import as_user


def many_keys(tenant, count: int) -> str:
    """`count` keys of `tenant` named <name>-<n>, copies of one made as the console makes them."""
    name = unique("many")
    key, _ = key_create(tenant=tenant, name=f"{name}-0")
    table = VirtualKey._meta.db_table
    copied = [
        f.column
        for f in VirtualKey._meta.concrete_fields
        if not f.primary_key and f.column not in ("name", "digest", "prefix")
    ]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (name, digest, prefix, {', '.join(copied)}) "  # noqa: S608
            f"SELECT %s || g, md5(%s || g), 'sk-t-' || substr(md5(%s || g), 1, 8), {', '.join(copied)} "
            f"FROM {table}, generate_series(1, %s) AS g WHERE id = %s",
            [f"{name}-", name, name, count - 1, key.pk],
        )
    return name


def test_a_key_list_past_the_cap_says_more_than_and_selects_without_a_number(tenancy):
    cap = CappedCountPaginator.CAP
    name = many_keys(tenancy.tenant, cap + 1)
    web = as_user(tenancy.owner)

    page = web.get("/admin/tenants/virtualkey/")
    assert page.context["cl"].result_count == cap + 1  # counted to one past the cap, no further
    text = page.content.decode()
    assert f"more than {cap}" in text
    assert f"Select all virtual keys the filters select (more than {cap})" in text
    assert f"Select all {cap + 1}" not in text

    # A page is read by its ids, then its rows: the rows and order of the list's query all the same.
    second = web.get("/admin/tenants/virtualkey/", {"p": "2"}).context["cl"].result_list
    keys = VirtualKey.objects.filter(tenant=tenancy.tenant).order_by("-created_at", "-id")
    assert [key.pk for key in second] == list(keys.values_list("pk", flat=True)[50:100])
    assert second[0].tenant.name == tenancy.tenant.name  # its tenant read with it (select_related)

    # Under the cap, the count is exact and "select all" names it.
    found = web.get("/admin/tenants/virtualkey/", {"q": f"{name}-1"})  # -1, -10..-19, ..., -1000..-1999, -10000
    expected = VirtualKey.objects.filter(tenant=tenancy.tenant, name__icontains=f"{name}-1").count()
    assert found.context["cl"].result_count == expected == 1112
    assert f"Select all {expected} virtual keys" in found.content.decode()

    # The other tenant's admin sees none of them.
    other = as_user(tenancy.outsider).get("/admin/tenants/virtualkey/", {"q": name})
    assert other.context["cl"].result_count == 0
