"""A tenant's screening policy as the request path carries it: a small frozen value inside the
key's cached settings (gateway.auth.KeyInfo), so screening reads no database. Secrets (the
guardrail's signing key, the moderation provider's API key) are not in it: KeyInfo is also cached
in Redis, and those are read per process (gateway.screening.resources)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.screening.personal_data import KINDS

GUARDRAIL = "guardrail"
INJECTION = "injection"
MODERATION = "moderation"
CHECKS = (*KINDS, INJECTION, MODERATION, GUARDRAIL)


@dataclass(frozen=True)
class Policy:
    # (check, action) for every input check that is not off: log, redact or block.
    input: tuple[tuple[str, str], ...] = ()
    phone_region: str = "US"
    output_personal_data: str = "off"
    output_moderation: str = "off"
    stream_window: int = 64
    moderation_provider_id: int | None = None
    moderation_model: str = ""
    moderation_timeout: float = 2.0
    moderation_input_fail_open: bool = False
    moderation_output_fail_open: bool = True
    guardrail_url: str = ""
    guardrail_timeout: float = 0.5
    guardrail_fail_open: bool = False

    def action(self, check: str) -> str:
        for name, action in self.input:
            if name == check:
                return action
        return "off"

    @property
    def personal_data_kinds(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.input if name in KINDS)

    @property
    def screens_output(self) -> bool:
        return self.output_personal_data != "off" or self.output_moderation != "off"

    @property
    def output_checks(self) -> list[str]:
        """The output checks that run, as the ledger row's screening record names them."""
        checks = (("personal_data", self.output_personal_data), (MODERATION, self.output_moderation))
        return [name for name, action in checks if action != "off"]

    @classmethod
    def from_json(cls, data: dict) -> Policy:
        return cls(**{**data, "input": tuple(tuple(item) for item in data["input"])})


def policy_from_model(row) -> Policy | None:
    """The Policy of a ScreeningPolicy row (None when the tenant has none or it is disabled)."""
    if row is None or not row.enabled:
        return None
    from gateway.screening.models import Outage

    return Policy(
        input=tuple(
            (check, getattr(row, check)) for check in (*KINDS, INJECTION, MODERATION) if getattr(row, check) != "off"
        )
        + (((GUARDRAIL, "block"),) if row.guardrail_url else ()),
        phone_region=row.phone_region.upper() or "US",
        output_personal_data=row.output_personal_data,
        output_moderation=row.output_moderation,
        stream_window=row.stream_window,
        moderation_provider_id=row.moderation_provider_id,
        moderation_model=row.moderation_model,
        moderation_timeout=row.moderation_timeout_ms / 1000,
        moderation_input_fail_open=row.moderation_input_outage == Outage.FAIL_OPEN,
        moderation_output_fail_open=row.moderation_output_outage == Outage.FAIL_OPEN,
        guardrail_url=row.guardrail_url,
        guardrail_timeout=row.guardrail_timeout_ms / 1000,
        guardrail_fail_open=row.guardrail_outage == Outage.FAIL_OPEN,
    )
