"""Safety screening of what goes to providers and what comes back (gateway.screening.engine is what
the request path calls). Also a Django app (label `screening`): the tenants' policies, their admin
and the screening report."""
