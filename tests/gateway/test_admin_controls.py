"""Manual traffic controls in the admin: forcing a breaker asks why, and the audit says who."""

from django.test import Client

from gateway.models import BreakerTransition, ControlAction, Deployment


def test_force_open_from_the_admin_is_audited(tenancy, make_model, live_db):
    _, (provider,) = make_model()
    deployment = Deployment.objects.get(name=provider)
    browser = Client()
    browser.force_login(tenancy.superuser)
    url = "/admin/gateway/deployment/"

    ask = browser.post(url, {"action": "force_open", "_selected_action": [deployment.pk]})
    assert ask.status_code == 200 and b"Why" in ask.content  # a reason is required first
    assert not ControlAction.objects.filter(subject=f"deployment {provider}").exists()

    done = browser.post(
        url, {"action": "force_open", "_selected_action": [deployment.pk], "apply": "1", "reason": "vendor outage"}
    )
    assert done.status_code == 302
    deployment.refresh_from_db()
    assert deployment.forced_state == "open"
    action = ControlAction.objects.get(subject=f"deployment {provider}")
    assert (action.action, action.actor, action.reason) == ("force_open", tenancy.superuser, "vendor outage")
    assert BreakerTransition.objects.filter(deployment=deployment, to_state="forced_open").count() == 1

    page = browser.get(f"{url}{deployment.pk}/change/")
    assert b"forced open" in page.content and b"vendor outage" in page.content
