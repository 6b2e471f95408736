"""Live summaries: one per tenant active in the last minute, and a last one at zero for a tenant that
just fell quiet (the dashboard drops to zero instead of freezing on its last busy minute)."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from sentinel.console.live import live_publish, tenant_summaries, without_money
from tests.billing.conftest import drain_all, hand_off_all, record


def test_active_and_just_quiet_tenants_get_summaries(make_tenant):
    busy, quiet, gone = make_tenant(), make_tenant(), make_tenant()
    now = timezone.now()
    hand_off_all(
        [
            record(busy, at=now - timedelta(seconds=5), cost="0.25", request_id="l1"),
            record(quiet, at=now - timedelta(seconds=90), request_id="l2"),
            record(gone, at=now - timedelta(seconds=150), request_id="l3"),
        ]
    )
    drain_all()
    summaries = {s["tenant_id"]: s for s in tenant_summaries(now=now)}
    assert summaries[busy.pk]["requests"] == 1 and summaries[busy.pk]["cost_usd"] == "0.2500000000"
    assert summaries[quiet.pk]["requests"] == 0 and summaries[quiet.pk]["p50_ms"] is None
    assert summaries[quiet.pk]["cost_usd"] == "0.0000000000"
    assert gone.pk not in summaries
    assert set(without_money(summaries[busy.pk])) & {"cost_usd", "saved_usd", "spend_today_usd"} == set()
    # Ten minutes on, nothing of theirs is published any more.
    later = live_publish(now=now + timedelta(minutes=10))
    assert not {s["tenant_id"] for s in later} & {busy.pk, quiet.pk, gone.pk}
