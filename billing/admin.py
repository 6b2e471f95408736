"""Billing in the Django admin: prices (an edit of a price already billed becomes a new version), the
read-only ledger and its dead letters, and the spend report page for finance (filter, view, download
CSV or XLSX)."""

import tempfile
from datetime import UTC, datetime, timedelta

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.exceptions import PermissionDenied, ValidationError
from django.db.models import Q, QuerySet
from django.http import FileResponse, Http404, HttpResponse, HttpResponseBadRequest, StreamingHttpResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from unfold.contrib.filters.admin import AutocompleteSelectFilter, RangeDateFilter, TextFilter
from unfold.utils import parse_date_str

from billing.exports import (
    cell_text,
    report_columns,
    report_csv,
    report_filename,
    report_labels,
    report_rows,
    report_xlsx,
    request_log_csv,
    request_log_xlsx,
)
from billing.ledger import record_text
from billing.models import LedgerDeadLetter, LedgerEntry, Price, SpendReport
from billing.prices import KIND_COLUMNS
from billing.selectors import DEFAULT_DIMENSIONS, DIMENSIONS, spend_report
from billing.services import price_change, price_create, price_is_used, price_validate_effective_from
from billing.statements import parse_month, statement, statement_csv, statement_pdf
from sentinel.console.filters import ModelRequestedFilter, ProviderFilter
from sentinel.console.scoping import (
    OperatorOnlyAdmin,
    ReportAdmin,
    TeamFilter,
    TenantFilter,
    TenantScopedAdmin,
    ViewOnly,
)
from sentinel.text import row_id
from tenants.audit import audit_export
from tenants.models import Team, TeamMembership, Tenant
from tenants.selectors import EXPORT_SPEND, SEE_SPEND, tenants_for

XLSX = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
EXPORTS = {
    "csv": (report_csv, "text/csv"),
    "xlsx": (report_xlsx, XLSX),
}


class PriceForm(forms.ModelForm):
    class Meta:
        model = Price
        fields = ["model", "input_per_token", "output_per_token", *KIND_COLUMNS, "effective_from"]

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        model, effective_from = data["model"], data["effective_from"]
        price = self.instance
        try:
            if price.pk and price_is_used(price=price):
                if effective_from != price.effective_from:  # unchanged means "from now", always allowed
                    price_validate_effective_from(model=model, effective_from=effective_from)
            elif not price.pk or (model, effective_from) != (price.model, price.effective_from):
                price_validate_effective_from(model=model, effective_from=effective_from)
        except ValidationError as error:
            raise ValidationError({"effective_from": error.messages}) from None
        return data

    def validate_unique(self):
        """A used price is never overwritten, so its own (model, moment) is no clash: the service
        decides where the edit goes, and checks uniqueness there."""


@admin.register(Price)
class PriceAdmin(OperatorOnlyAdmin):
    form = PriceForm
    list_display = ["model", "input_per_token", "output_per_token", "effective_from", "source"]
    search_fields = ["model"]
    list_filter = ["source"]
    readonly_fields = ["source", "created_at"]

    def save_model(self, request, obj, form, change):
        fields = {name: form.cleaned_data[name] for name in PriceForm.Meta.fields if name not in KIND_COLUMNS}
        fields["kind_prices"] = {column: form.cleaned_data[column] for column in KIND_COLUMNS}
        if change:
            original = Price.objects.get(pk=obj.pk)
            saved = price_change(price=original, **fields)
            if saved.pk != original.pk:
                messages.info(
                    request,
                    f"Requests were already billed at {original}, so it stays as it was: the new price is a "
                    f"new version, in force from {saved.effective_from:%Y-%m-%d %H:%M:%S} UTC.",
                )
        else:
            saved = price_create(**fields)
        for model_field in Price._meta.concrete_fields:
            setattr(obj, model_field.attname, getattr(saved, model_field.attname))

    def has_delete_permission(self, request, obj=None):
        if obj is not None and price_is_used(price=obj):
            return False
        return super().has_delete_permission(request, obj)


# The request log's filters offer their choices from small tables (or fixed lists), never from a
# DISTINCT over the ledger: Django's field filters and date hierarchy read every row of the tenant's
# ledger for their choices, seconds at a million rows (bench/console.py).


class EndUserFilter(TextFilter):
    """One end user's requests (the request's `user`, exactly as the app sent it): an exact match,
    which the ledger's end-user index answers at any size, where a substring search would scan."""

    title = "user"
    parameter_name = "end_user"

    def queryset(self, request, queryset):
        value = (self.value() or "").strip()
        return queryset.filter(end_user=value) if value else queryset


class StatusFilter(admin.SimpleListFilter):
    """The statuses the gateway answers with."""

    title = "status"
    parameter_name = "status_code__exact"
    STATUSES = {
        200: "200 answered",
        400: "400 bad request",
        401: "401 invalid key",
        402: "402 over budget",
        403: "403 refused",
        404: "404 not found",
        408: "408 timed out",
        429: "429 rate limited",
        499: "499 client left",
        500: "500 server error",
        502: "502 provider error",
        503: "503 unavailable",
        504: "504 provider timed out",
    }

    def lookups(self, request, model_admin):
        return [(str(code), label) for code, label in self.STATUSES.items()]

    def queryset(self, request, queryset):
        code = row_id(self.value())
        return queryset if code is None else queryset.filter(status_code=code)


class UtcDaysFilter(RangeDateFilter):
    """From one UTC day to another, both included: [from 00:00, the day after `to` 00:00), a range the
    ledger's (tenant, created_at) index answers (a date compared with a time would drop `to`'s day)."""

    def queryset(self, request, queryset):
        bounds = {}
        start = parse_date_str(self.used_parameters.get(f"{self.parameter_name}_from") or "")
        end = parse_date_str(self.used_parameters.get(f"{self.parameter_name}_to") or "")
        if start is not None:
            bounds[f"{self.parameter_name}__gte"] = datetime.combine(start, datetime.min.time(), UTC)
        if end is not None:
            bounds[f"{self.parameter_name}__lt"] = datetime.combine(end + timedelta(days=1), datetime.min.time(), UTC)
        return queryset.filter(**bounds)


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ViewOnly, TenantScopedAdmin):
    """The request log: a tenant's admins and finance see their tenant's requests, filter them and
    download what the filters select (CSV streamed, XLSX written row by row); nobody edits them."""

    view_roles = SEE_SPEND
    team_lookup = "team_id"  # a team's members read its requests, no other team's
    list_display = [
        "created_at",
        "request_id",
        "tenant",
        "team",
        "model_requested",
        "end_user",
        "provider",
        "status_code",
        "prompt_tokens",
        "completion_tokens",
        "cost_usd",
        "cache_tier",
        "latency_ms",
    ]
    list_filter = [
        ("created_at", UtcDaysFilter),
        StatusFilter,
        "cache_tier",
        ("key", AutocompleteSelectFilter),  # typed, from the key list's search: a tenant may have a million
        ModelRequestedFilter,
        EndUserFilter,
        ProviderFilter,
        TenantFilter,
        TeamFilter,
    ]
    list_select_related = ["tenant", "team"]
    search_fields = ["request_id"]
    change_list_template = "admin/billing/ledgerentry/change_list.html"

    def get_search_results(self, request, queryset, search_term):
        """A request id exactly as the client got it (x-request-id), found by its index: a part of one
        (Django's icontains), or one in any case (its `=` search, iexact), is a read of every row."""
        term = search_term.strip()
        return (queryset.filter(request_id=term) if term else queryset), False

    def get_urls(self):
        export = path("export/", self.admin_site.admin_view(self.export_view), name="billing_ledgerentry_export")
        return [export, *super().get_urls()]

    def export_view(self, request):
        """The rows the changelist's filters select (the same query string), as CSV or XLSX."""
        if not self.has_view_permission(request):
            raise PermissionDenied
        kind = request.GET.get("format", "csv")
        if kind not in ("csv", "xlsx"):
            raise Http404("Exports are csv or xlsx.")
        query = request.GET.copy()
        query.pop("format", None)
        request.GET = query  # the changelist reads its filters from here
        try:
            entries = self.get_changelist_instance(request).get_queryset(request)
        except IncorrectLookupParameters:
            # A parameter the list does not filter by (the list itself redirects to ?e=1): say so, and
            # export nothing rather than more than was asked for.
            return HttpResponseBadRequest(
                "Unknown or invalid filter in the query string.", content_type="text/plain; charset=utf-8"
            )
        visible = self.visible_tenant_ids(request)  # None: an operator's, every tenant
        chosen = row_id(request.GET.get("tenant"))
        if chosen is not None and (visible is None or chosen in visible):
            scope = [chosen]
        else:
            scope = list(visible) if visible is not None else [None]
        if visible is not None:  # a team member's export is logged to their teams' tenants too
            teams = self.team_ids(request, self.team_view_roles)
            scope += sorted(set(Tenant.objects.filter(teams__in=teams).values_list("pk", flat=True)) - set(scope))
        audit_export(
            tenant_ids=scope,
            what=f"request log ({kind}){' ?' + query.urlencode() if query else ''}",
            request=request,
        )
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        if kind == "csv":
            response = StreamingHttpResponse(request_log_csv(entries), content_type="text/csv")
        else:
            handle = tempfile.TemporaryFile()  # noqa: SIM115 - FileResponse closes it once sent
            request_log_xlsx(entries, handle)
            handle.seek(0)
            response = FileResponse(handle, content_type=XLSX)
        response["Content-Disposition"] = f'attachment; filename="requests-{stamp}.{kind}"'
        return response


@admin.register(LedgerDeadLetter)
class LedgerDeadLetterAdmin(ViewOnly, TenantScopedAdmin):
    """Ledger records the database refused, each with why and the record as it was queued: operators
    see all of them, a tenant's admins and finance those naming their tenant; nobody edits them. The
    record is shown escaped (control characters as \\x escapes, HTML as text), whatever bytes it holds."""

    view_roles = SEE_SPEND
    manage_roles = frozenset()
    list_display = ["created_at", "queued_at", "tenant", "kind", "request_id", "short_reason", "short_record"]
    list_filter = ["kind", TenantFilter]
    list_select_related = ["tenant"]
    search_fields = ["request_id", "stream_id"]
    date_hierarchy = "created_at"
    fields = ["created_at", "queued_at", "tenant", "kind", "request_id", "reason", "stream_id", "digest", "shown"]
    readonly_fields = fields

    @admin.display(description="reason")
    def short_reason(self, obj: LedgerDeadLetter) -> str:
        return obj.reason if len(obj.reason) <= 120 else obj.reason[:119] + "…"

    @admin.display(description="record")
    def short_record(self, obj: LedgerDeadLetter) -> str:
        return record_text(bytes(obj.record), limit=120, indent=False)

    @admin.display(description="record")
    def shown(self, obj: LedgerDeadLetter) -> str:
        return format_html('<pre style="white-space: pre-wrap">{}</pre>', record_text(bytes(obj.record)))


class SpendReportForm(forms.Form):
    start = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), help_text="First UTC day.")
    end = forms.DateField(widget=forms.DateInput(attrs={"type": "date"}), help_text="Last UTC day (included).")
    tenant = forms.ModelChoiceField(queryset=Tenant.objects.none(), required=False, empty_label="All my tenants")
    team = forms.ModelChoiceField(
        queryset=Team.objects.none(), required=False, empty_label="Every team, and keys of none"
    )
    group_by = forms.MultipleChoiceField(
        choices=[(name, name) for name in DIMENSIONS], widget=forms.CheckboxSelectMultiple, required=False
    )

    def __init__(self, *args, user, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["tenant"].queryset = tenants_for(user, SEE_SPEND)
        self.fields["tenant"].to_field_name = "slug"
        self.fields["team"].queryset = teams_with_visible_spend(user).select_related("tenant")
        self.fields["team"].label_from_instance = lambda team: f"{team.tenant.name} / {team.name}"


def teams_with_visible_spend(user) -> QuerySet[Team]:
    """The teams whose spend `user` sees: every team of a tenant whose spend they see, and their own
    teams (a team's members see its spend, no other team's)."""
    if user.is_superuser:
        return Team.objects.all()
    return Team.objects.filter(Q(tenant__in=tenants_for(user, SEE_SPEND)) | Q(memberships__user=user)).distinct()


def report_scope(
    user, tenant: Tenant | None, team: Team | None, roles: frozenset[str]
) -> tuple[list[Tenant], list[int] | None]:
    """The tenants (and teams: None for all of theirs) a report covers: one team, chosen among the
    teams the user may see; else one tenant or every tenant where the user holds one of `roles`;
    for a member of teams alone, their teams. Raises PermissionDenied for nothing at all."""
    if team is not None:
        if tenants_for(user, roles).filter(pk=team.tenant_id).exists() or team.memberships.filter(user=user).exists():
            return [team.tenant], [team.pk]
        raise PermissionDenied
    allowed = tenants_for(user, roles)
    if tenant is not None:
        if not allowed.filter(pk=tenant.pk).exists():
            raise PermissionDenied
        return [tenant], None
    tenants = list(allowed)
    if tenants:
        return tenants, None
    own = list(Team.objects.filter(memberships__user=user).select_related("tenant"))
    if not own:
        raise PermissionDenied
    return list({team.tenant_id: team.tenant for team in own}.values()), [team.pk for team in own]

    def clean(self):
        data = super().clean()
        if data.get("start") and data.get("end") and data["end"] < data["start"]:
            raise ValidationError({"end": "Must not be before start."})
        return data


def table_body(rows: list[list[str]]) -> SafeString:
    """The report's rows as HTML table rows, the last (the totals) marked. Built here rather than in
    the template: a report by end user has thousands of rows, and the template's loop spent about
    0.1 ms a cell on them (0.45 s for 5,000 users)."""
    last = len(rows) - 1
    return mark_safe(  # noqa: S308 - every value is escaped
        "".join(
            ('<tr class="total">' if number == last else "<tr>")
            + "".join(f"<td>{escape(value)}</td>" for value in row)
            + "</tr>"
            for number, row in enumerate(rows)
        )
    )


@admin.register(SpendReport)
class SpendReportAdmin(ReportAdmin):
    """The spend report page. Visible to anyone who may see the spend of at least one tenant; exports
    need the export role in every tenant exported."""

    report_roles = SEE_SPEND

    def has_module_permission(self, request):
        """Also a team's members: their team's spend."""
        user = request.user
        if super().has_module_permission(request):
            return True
        return user.is_authenticated and user.is_active and TeamMembership.objects.filter(user=user).exists()

    def report(self, request):
        today = timezone.now().date()
        initial = {"start": today.replace(day=1), "end": today, "group_by": list(DEFAULT_DIMENSIONS)}
        form = SpendReportForm(request.GET if "start" in request.GET else None, user=request.user, initial=initial)
        report = None
        if form.is_valid():
            data = form.cleaned_data
            export = request.GET.get("format")
            roles = EXPORT_SPEND if export in EXPORTS else SEE_SPEND
            tenants, team_ids = report_scope(request.user, data["tenant"], data["team"], roles)
            if data["end"] - data["start"] > timedelta(days=366):
                form.add_error("end", "A report covers at most 366 days.")
            else:
                report = spend_report(
                    tenants=tenants,
                    start=data["start"],
                    end=data["end"],
                    group_by=data["group_by"],
                    team_ids=team_ids,
                )
                if export in EXPORTS:
                    build, content_type = EXPORTS[export]
                    audit_export(
                        tenant_ids=[tenant.pk for tenant in tenants],
                        what=f"spend report {data['start']}..{data['end']} ({export})",
                        request=request,
                    )
                    response = HttpResponse(build(report), content_type=content_type)
                    response["Content-Disposition"] = f'attachment; filename="{report_filename(report, export)}"'
                    return response
        rows = [[cell_text(value) for value in row] for row in report_rows(report)] if report else []
        context = {
            **self.admin_site.each_context(request),
            "title": "Spend report",
            "opts": self.model._meta,
            "form": form,
            "report": report,
            "columns": report_columns(report) if report else [],
            "labels": report_labels(report) if report else [],
            "rows": rows,
            "body": table_body(rows),
            "query": request.GET.urlencode(),
            "may_export": tenants_for(request.user, EXPORT_SPEND).exists()
            or TeamMembership.objects.filter(user=request.user).exists(),
            "statement_tenants": tenants_for(request.user, EXPORT_SPEND).order_by("name"),
            "last_month": (today.replace(day=1) - timedelta(days=1)).strftime("%Y-%m"),
        }
        return TemplateResponse(request, "admin/billing/spend_report.html", context)

    def get_urls(self):
        statement_url = path(
            "statement/", self.admin_site.admin_view(self.statement_view), name="billing_spendreport_statement"
        )
        return [statement_url, *super().get_urls()]

    def statement_view(self, request):
        """A tenant's monthly statement (?tenant=slug&month=YYYY-MM&format=pdf|csv), for those who may
        export that tenant's spend."""
        tenant = tenants_for(request.user, EXPORT_SPEND).filter(slug=request.GET.get("tenant", "")).first()
        if tenant is None:
            raise Http404("No tenant of yours whose spend you may export has this slug.")
        month, kind = parse_month(request.GET.get("month", "")), request.GET.get("format", "pdf")
        if month is None or kind not in ("pdf", "csv"):
            return HttpResponse("Give month=YYYY-MM and format=pdf or csv.", status=400, content_type="text/plain")
        st = statement(tenant=tenant, month=month)
        audit_export(tenant_ids=[tenant.pk], what=f"statement {st.filename} ({kind})", request=request)
        if kind == "csv":
            response = HttpResponse(statement_csv(st), content_type="text/csv")
        else:
            response = HttpResponse(statement_pdf(st), content_type="application/pdf")
        response["Content-Disposition"] = f'attachment; filename="{st.filename}.{kind}"'
        return response
