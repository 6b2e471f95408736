"""Upstream: which deployments may serve a request (routing, the "auto" classifier), calling them (providers,
the fast transport), what a failure means (failures) and when to stop trying one (breakers)."""
