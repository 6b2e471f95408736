"""A tenant's screening policy: what each check does to input and output, which way each outside
service fails, and the tenant's own HTTP guardrail."""

from __future__ import annotations

from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

from sentinel.crypto import decrypt, encrypt


class Action(models.TextChoices):
    OFF = "off", "Off"
    LOG = "log", "Log only"
    REDACT = "redact", "Redact (mask the span)"
    BLOCK = "block", "Block (400 content_policy_violation)"


class Outage(models.TextChoices):
    FAIL_CLOSED = "closed", "Fail closed (refuse or withhold)"
    FAIL_OPEN = "open", "Fail open (let it through, counted)"


def _action(default: str, help_text: str) -> models.CharField:
    return models.CharField(max_length=8, choices=Action.choices, default=default, help_text=help_text)


class ScreeningPolicy(models.Model):
    """One per tenant; a tenant without one is not screened (and pays nothing for it)."""

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.CASCADE, related_name="screening_policy")
    enabled = models.BooleanField(default=True)

    # Input, per check.
    email = _action(Action.REDACT, "E-mail addresses.")
    phone = _action(Action.REDACT, "Phone numbers (valid in the region below, or written with a country code).")
    payment_card = _action(Action.BLOCK, "Payment card numbers (Luhn-checked, card network prefixes).")
    iban = _action(Action.REDACT, "IBANs (country length and mod-97 checked).")
    national_id = _action(Action.BLOCK, "National ID numbers (SSN, SIN, DNI/NIE, codice fiscale, NIR, CPF, ...).")
    ip_address = _action(Action.LOG, "IP addresses (not loopback, netmasks or networks).")
    secret = _action(Action.BLOCK, "API keys, tokens, private keys, passwords stated in the text.")
    injection = _action(
        Action.BLOCK, "Prompt injection and jailbreak attempts, in every message but the system/developer prompt."
    )
    moderation = _action(Action.BLOCK, "Harmful requests: the local check, and the moderation provider if set.")
    phone_region = models.CharField(
        max_length=2, default="US", help_text="Two-letter country whose national phone formats are recognized."
    )

    # Output.
    output_personal_data = _action(Action.REDACT, "Personal data and secrets in answers (every kind above).")
    output_moderation = _action(Action.BLOCK, "Harmful content in answers.")
    stream_window = models.PositiveIntegerField(
        default=64,
        validators=[MinValueValidator(32), MaxValueValidator(1024)],
        help_text="Streams: characters held back so a number split across chunks is caught before it is sent.",
    )

    # A moderation endpoint through litellm (OpenAI's /v1/moderations shape).
    moderation_provider = models.ForeignKey(
        "gateway.Provider",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Provider whose moderation endpoint checks input and non-streamed answers. Empty: local check only.",
    )
    moderation_model = models.CharField(max_length=120, default="omni-moderation-latest", blank=True)
    moderation_timeout_ms = models.PositiveIntegerField(
        default=2000, validators=[MinValueValidator(50), MaxValueValidator(30_000)]
    )
    moderation_input_outage = models.CharField(
        max_length=8,
        choices=Outage.choices,
        default=Outage.FAIL_CLOSED,
        help_text="Input the moderation provider cannot screen: refuse it (503) or let it through.",
    )
    moderation_output_outage = models.CharField(
        max_length=8,
        choices=Outage.choices,
        default=Outage.FAIL_OPEN,
        help_text="An answer already generated that the provider cannot screen: deliver it or withhold it.",
    )

    # The tenant's own guardrail.
    guardrail_url = models.URLField(
        max_length=500,
        blank=True,
        help_text="POSTed each request's messages (HMAC-signed); answers allow/block/redact.",
    )
    guardrail_timeout_ms = models.PositiveIntegerField(
        default=500, validators=[MinValueValidator(20), MaxValueValidator(10_000)]
    )
    guardrail_secret_encrypted = models.BinaryField(editable=False, default=b"")
    guardrail_outage = models.CharField(
        max_length=8,
        choices=Outage.choices,
        default=Outage.FAIL_CLOSED,
        help_text="When the guardrail errs or times out: refuse the request (503) or let it through.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "screening policy"
        verbose_name_plural = "screening policies"

    def __str__(self) -> str:
        return f"screening policy of {self.tenant}"

    def clean(self) -> None:
        from django.core.exceptions import ValidationError

        from sentinel.egress import url_problem

        problem = url_problem(self.guardrail_url) if self.guardrail_url else None
        if problem:
            raise ValidationError({"guardrail_url": problem})

    def set_guardrail_secret(self, secret: str) -> None:
        self.guardrail_secret_encrypted = encrypt("guardrail-secrets", secret)

    def guardrail_secret(self) -> str:
        return decrypt("guardrail-secrets", self.guardrail_secret_encrypted) if self.guardrail_secret_encrypted else ""


class ScreeningReport(ScreeningPolicy):
    """The console's page of screening decisions per tenant and check (counted from the ledger)."""

    class Meta:
        proxy = True
        verbose_name = "screening report"
        verbose_name_plural = "screening report"
