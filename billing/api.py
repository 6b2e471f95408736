"""Billing's management API (/api/v1/): spend reports as JSON, CSV or XLSX, and a tenant's request
log. Every view scopes what it returns to the tenants the user holds the needed role in; another
tenant's URL answers 404 (403 where the user is a member without the role), never data."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import QuerySet
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_serializer, inline_serializer
from rest_framework import serializers
from rest_framework.exceptions import NotFound, PermissionDenied, ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.renderers import BaseRenderer, BrowsableAPIRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.exports import report_csv, report_filename, report_xlsx
from billing.models import LedgerEntry
from billing.selectors import DEFAULT_DIMENSIONS, DIMENSIONS, ledger_entries, spend_report
from sentinel.text import BIGINT_MAX, no_control_characters
from tenants.audit import audit_export
from tenants.models import Team, Tenant
from tenants.selectors import ALL_ROLES, EXPORT_SPEND, MANAGE, SEE_SPEND, tenants_for

MAX_REPORT_DAYS = 366


def tenants_in_scope(user, roles: frozenset[str], slug: str | None = None) -> list[Tenant]:
    """The tenants `user` may act on with `roles`: one (by slug) or all of them."""
    if slug is not None:
        tenant = tenants_for(user, roles).filter(slug=slug).first()
        if tenant is not None:
            return [tenant]
        if tenants_for(user, ALL_ROLES).filter(slug=slug).exists():
            raise PermissionDenied("Your role in this tenant does not allow this.")
        raise NotFound("No such tenant.")
    tenants = list(tenants_for(user, roles))
    if not tenants:
        raise PermissionDenied("Your roles do not allow this in any tenant.")
    return tenants


class RowIdField(serializers.IntegerField):
    """A row's id in a query string: ASCII digits, 1 to PostgreSQL's bigint (DRF's IntegerField also
    reads other scripts' digits and padding, and numbers past what the column holds)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(min_value=1, max_value=BIGINT_MAX, **kwargs)

    def to_internal_value(self, data):
        if isinstance(data, str) and not (data.isascii() and data.isdigit()):
            self.fail("invalid")
        return super().to_internal_value(data)


class FileRenderer(BaseRenderer):
    """Passes through a file the view already built (errors are rendered as JSON instead)."""

    charset = None

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data


class CSVRenderer(FileRenderer):
    media_type = "text/csv"
    format = "csv"


class XLSXRenderer(FileRenderer):
    media_type = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
    format = "xlsx"


# --- spend report ------------------------------------------------------------------------------


class TenantRefSerializer(serializers.Serializer):
    slug = serializers.SlugField()
    name = serializers.CharField()


class TeamRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class KeyRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    prefix = serializers.CharField()


def _kind_price(help_text: str) -> serializers.DecimalField:
    return serializers.DecimalField(max_digits=20, decimal_places=15, allow_null=True, help_text=help_text)


def _money(help_text: str, **kwargs) -> serializers.DecimalField:
    return serializers.DecimalField(max_digits=24, decimal_places=10, help_text=help_text, **kwargs)


class PriceRefSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    model = serializers.CharField()
    effective_from = serializers.DateTimeField()
    input_per_token = serializers.DecimalField(max_digits=20, decimal_places=15)
    output_per_token = serializers.DecimalField(max_digits=20, decimal_places=15)
    cache_read_per_token = _kind_price("Cache reads; null: the input price.")
    cache_write_per_token = _kind_price("Cache writes; null: the input price.")
    reasoning_per_token = _kind_price("Reasoning tokens; null: the output price.")
    batch_input_per_token = _kind_price("Batch prompt tokens; null: the input price.")
    batch_output_per_token = _kind_price("Batch completion tokens; null: the output price.")
    batch_cache_read_per_token = _kind_price("Batch cache reads; null: the cache read price, else batch input.")
    batch_cache_write_per_token = _kind_price("Batch cache writes; null: the cache write price, else batch input.")


class SpendTotalsSerializer(serializers.Serializer):
    requests = serializers.IntegerField(source="metrics.requests")
    successful_requests = serializers.IntegerField(source="metrics.successful_requests")
    prompt_tokens = serializers.IntegerField(source="metrics.prompt_tokens")
    completion_tokens = serializers.IntegerField(source="metrics.completion_tokens")
    cost_usd = serializers.DecimalField(max_digits=24, decimal_places=10, source="metrics.cost_usd")
    exact_hits = serializers.IntegerField(source="metrics.exact_hits")
    semantic_hits = serializers.IntegerField(source="metrics.semantic_hits")
    saved_cost_usd = serializers.DecimalField(max_digits=24, decimal_places=10, source="metrics.saved_cost_usd")
    cache_read_tokens = serializers.IntegerField(
        source="metrics.cache_read_tokens", help_text="Of the prompt tokens: read from the provider's cache."
    )
    cache_write_tokens = serializers.IntegerField(
        source="metrics.cache_write_tokens", help_text="Of the prompt tokens: written to the provider's cache."
    )
    reasoning_tokens = serializers.IntegerField(
        source="metrics.reasoning_tokens", help_text="Of the completion tokens: reasoning."
    )
    cache_read_cost_usd = _money("Of cost_usd: cache reads.", source="metrics.cache_read_cost_usd")
    cache_write_cost_usd = _money("Of cost_usd: cache writes.", source="metrics.cache_write_cost_usd")
    reasoning_cost_usd = _money("Of cost_usd: reasoning tokens.", source="metrics.reasoning_cost_usd")
    images = serializers.IntegerField(source="metrics.images", help_text="Images generated; their cost is in cost_usd.")


class SpendRowSerializer(SpendTotalsSerializer):
    day = serializers.DateField(allow_null=True)
    tenant = TenantRefSerializer(allow_null=True)
    team = TeamRefSerializer(allow_null=True, help_text="Grouped by team: null for keys of no team.")
    key = KeyRefSerializer(allow_null=True)
    end_user = serializers.CharField(
        allow_null=True, allow_blank=True, help_text="The end user (OpenAI's `user` field); empty: none named."
    )
    model = serializers.CharField(allow_null=True)
    price = PriceRefSerializer(allow_null=True, help_text="The price version the requests were billed at.")


class ApiErrorSerializer(serializers.Serializer):
    """DRF's error body on the management API (not the gateway's OpenAI-shaped Error)."""

    detail = serializers.CharField()


# What every management endpoint may answer besides its result (DRF's error bodies).
API_ERRORS = {
    400: OpenApiResponse(OpenApiTypes.OBJECT, description="Invalid parameters: {field: [messages]}."),
    401: OpenApiResponse(ApiErrorSerializer, description="Not signed in."),
    403: OpenApiResponse(ApiErrorSerializer, description="Signed in, but the role does not allow it."),
    404: OpenApiResponse(ApiErrorSerializer, description="No such tenant among the caller's."),
    429: OpenApiResponse(ApiErrorSerializer, description="Too many failed sign-ins."),
}


class SpendReportApi(APIView):
    """Spend for a date range, grouped by any of day, tenant, team, key, end user, model and price version,
    with totals; `team` narrows it to one team's requests. `format=csv` or `format=xlsx` (or the matching
    Accept header) downloads it as a file."""

    renderer_classes = [JSONRenderer, BrowsableAPIRenderer, CSVRenderer, XLSXRenderer]

    class InputSerializer(serializers.Serializer):
        start = serializers.DateField(help_text="First UTC day, YYYY-MM-DD.")
        end = serializers.DateField(help_text="Last UTC day, YYYY-MM-DD (included).")
        group_by = serializers.CharField(
            required=False,
            default=",".join(DEFAULT_DIMENSIONS),
            help_text=f"Comma-separated, any of: {', '.join(DIMENSIONS)}. Empty: totals only.",
            allow_blank=True,
            validators=[no_control_characters],
        )
        tenant = serializers.SlugField(required=False, help_text="One tenant; default: every tenant you may see.")
        team = RowIdField(required=False, help_text="One team's requests (its id); default: every team's and none.")
        format = serializers.ChoiceField(choices=["json", "csv", "xlsx"], required=False)

        def validate_group_by(self, value: str) -> list[str]:
            names = [name.strip() for name in value.split(",") if name.strip()]
            unknown = sorted(set(names) - set(DIMENSIONS))
            if unknown:
                raise ValidationError(f"Unknown dimension(s): {', '.join(unknown)}. Use {', '.join(DIMENSIONS)}.")
            return names

        def validate(self, data: dict) -> dict:
            if data["end"] < data["start"]:
                raise ValidationError({"end": ["Must not be before start."]})
            if data["end"] - data["start"] >= timedelta(days=MAX_REPORT_DAYS):
                raise ValidationError({"end": [f"A report covers at most {MAX_REPORT_DAYS} days."]})
            return data

    @extend_schema_serializer(component_name="SpendReport")
    class OutputSerializer(serializers.Serializer):
        start = serializers.DateField()
        end = serializers.DateField()
        group_by = serializers.ListField(child=serializers.CharField())
        tenants = serializers.ListField(child=serializers.SlugField(), source="tenant_slugs")
        rows = SpendRowSerializer(many=True)
        totals = SpendTotalsSerializer()

    def perform_content_negotiation(self, request, force=False):
        requested = request.query_params.get("format")
        if not force and requested is not None and requested not in ("json", "api", "csv", "xlsx"):
            raise ValidationError({"format": ["Must be one of json, csv, xlsx."]})
        return super().perform_content_negotiation(request, force)

    def handle_exception(self, exc):
        response = super().handle_exception(exc)
        if isinstance(getattr(self.request, "accepted_renderer", None), FileRenderer):
            self.request.accepted_renderer = JSONRenderer()
            self.request.accepted_media_type = JSONRenderer.media_type
        return response

    @extend_schema(
        operation_id="spend_report",
        parameters=[InputSerializer],
        responses={
            (200, "application/json"): OutputSerializer,
            (200, CSVRenderer.media_type): OpenApiResponse(OpenApiTypes.BINARY, description="The report as CSV."),
            (200, XLSXRenderer.media_type): OpenApiResponse(OpenApiTypes.BINARY, description="The report as XLSX."),
            **{(status, "application/json"): response for status, response in API_ERRORS.items()},
        },
    )
    def get(self, request):
        params = self.InputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        data = params.validated_data
        renderer = request.accepted_renderer
        roles = EXPORT_SPEND if isinstance(renderer, FileRenderer) else SEE_SPEND
        tenants = tenants_in_scope(request.user, roles, data.get("tenant"))
        team_ids = None
        if "team" in data:
            team = Team.objects.filter(pk=data["team"], tenant__in=tenants).first()
            if team is None:
                raise NotFound("No such team in your tenants.")
            tenants, team_ids = [team.tenant], [team.pk]
        report = spend_report(
            tenants=tenants, start=data["start"], end=data["end"], group_by=data["group_by"], team_ids=team_ids
        )
        if isinstance(renderer, FileRenderer):
            content = report_csv(report) if renderer.format == "csv" else report_xlsx(report)
            audit_export(
                tenant_ids=[tenant.pk for tenant in tenants],
                what=f"spend report {data['start']}..{data['end']} ({renderer.format}, API)",
                request=request,
            )
            disposition = f'attachment; filename="{report_filename(report, renderer.format)}"'
            return Response(content, headers={"Content-Disposition": disposition})
        return Response(self.OutputSerializer(report).data)


# --- request log -------------------------------------------------------------------------------


class RequestLogPagination(CursorPagination):
    ordering = ("-created_at", "-id")
    page_size = 50
    page_size_query_param = "limit"
    max_page_size = 500

    def decode_cursor(self, request):
        """DRF's, and the position must be a time: a cursor is base64 a client can forge, and DRF puts
        its position in the query as given (`p=2026`: a ValidationError from the datetime field, a 500)."""
        cursor = super().decode_cursor(request)
        if cursor is not None and cursor.position is not None:
            try:
                when = parse_datetime(cursor.position)
            except ValueError:  # well formed, no real time (month 13)
                when = None
            if when is None:
                raise NotFound(self.invalid_cursor_message)
        return cursor


class RequestLogApi(APIView):
    """A tenant's requests, newest first, for its admins: filter by UTC days, status, model,
    provider, cache tier and key; page with the `next` link."""

    class InputSerializer(serializers.Serializer):
        start = serializers.DateField(required=False, help_text="First UTC day, YYYY-MM-DD.")
        end = serializers.DateField(required=False, help_text="Last UTC day, YYYY-MM-DD (included).")
        status = serializers.IntegerField(required=False, min_value=100, max_value=599, help_text="HTTP status.")
        model = serializers.CharField(
            required=False, max_length=200, help_text="The model asked for.", validators=[no_control_characters]
        )
        provider = serializers.CharField(required=False, max_length=80, validators=[no_control_characters])
        cache = serializers.ChoiceField(choices=LedgerEntry.CacheTier.values, required=False)
        key = RowIdField(required=False, help_text="A virtual key's id.")
        limit = serializers.IntegerField(required=False, min_value=1, max_value=500, help_text="Page size (50).")
        cursor = serializers.CharField(
            required=False, help_text="Opaque; from a page's next or previous link.", validators=[no_control_characters]
        )

        def validate(self, data: dict) -> dict:
            if "start" in data and "end" in data and data["end"] < data["start"]:
                raise ValidationError({"end": ["Must not be before start."]})
            return data

    @extend_schema_serializer(component_name="LoggedRequest")
    class OutputSerializer(serializers.Serializer):
        id = serializers.UUIDField()
        request_id = serializers.CharField()
        created_at = serializers.DateTimeField()
        key = KeyRefSerializer(allow_null=True)
        model_requested = serializers.CharField()
        model_served = serializers.CharField()
        deployment = serializers.CharField()
        provider = serializers.CharField()
        stream = serializers.BooleanField()
        status_code = serializers.IntegerField()
        error_code = serializers.CharField()
        prompt_tokens = serializers.IntegerField()
        completion_tokens = serializers.IntegerField()
        cache_read_tokens = serializers.IntegerField(help_text="Of the prompt tokens: read from the provider's cache.")
        cache_write_tokens = serializers.IntegerField(
            help_text="Of the prompt tokens: written to the provider's cache."
        )
        reasoning_tokens = serializers.IntegerField(help_text="Of the completion tokens: reasoning.")
        cost_usd = serializers.DecimalField(max_digits=20, decimal_places=10)
        cache_read_cost_usd = serializers.DecimalField(
            max_digits=20, decimal_places=10, help_text="Of cost_usd: cache reads."
        )
        cache_write_cost_usd = serializers.DecimalField(
            max_digits=20, decimal_places=10, help_text="Of cost_usd: cache writes."
        )
        reasoning_cost_usd = serializers.DecimalField(
            max_digits=20, decimal_places=10, help_text="Of cost_usd: reasoning tokens."
        )
        batch = serializers.BooleanField(help_text="A Batch API item, billed at batch rates.")
        images = serializers.IntegerField(help_text="Images generated; their cost is in cost_usd.")
        price = PriceRefSerializer(allow_null=True)
        cache_tier = serializers.CharField()
        saved_cost_usd = serializers.DecimalField(max_digits=20, decimal_places=10)
        latency_ms = serializers.IntegerField()
        ttft_ms = serializers.IntegerField(allow_null=True)
        fallbacks = serializers.IntegerField()
        fallback_reasons = serializers.CharField(
            help_text="Each deployment passed over and why (`<deployment>=<reason>`, comma-separated), else empty."
        )
        route = serializers.CharField(help_text='What `model: "auto"` chose (fast or smart), else empty.')
        route_reason = serializers.CharField()
        escalated_from = serializers.CharField(help_text="The deployment whose refusal was escalated, else empty.")

    @extend_schema(
        operation_id="tenant_requests",
        parameters=[InputSerializer],
        responses={
            200: inline_serializer(
                "RequestLogPage",
                {
                    "next": serializers.URLField(allow_null=True),
                    "previous": serializers.URLField(allow_null=True),
                    "results": OutputSerializer(many=True),
                },
            ),
            **API_ERRORS,
        },
    )
    def get(self, request, slug: str):
        (tenant,) = tenants_in_scope(request.user, MANAGE, slug)
        params = self.InputSerializer(data=request.query_params)
        params.is_valid(raise_exception=True)
        filters = params.validated_data
        entries: QuerySet[LedgerEntry] = ledger_entries(
            tenant_id=tenant.pk,
            start=filters.get("start"),
            end=filters.get("end"),
            status=filters.get("status"),
            model=filters.get("model"),
            provider=filters.get("provider"),
            cache_tier=filters.get("cache"),
            key_id=filters.get("key"),
        )
        paginator = RequestLogPagination()
        page = paginator.paginate_queryset(entries, request, view=self)
        return paginator.get_paginated_response(self.OutputSerializer(page, many=True).data)
