"""Knowledge bases in the console: a tenant's admins create stores, upload documents into them
(ingested by a worker, as through the API), see each file's status and error, re-index and delete.
Registered by gateway.admin (the gateway app's admin module)."""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.core.exceptions import ValidationError
from django.db.models import Count, Q, Sum
from unfold.admin import TabularInline

from gateway.batches.models import BatchFile
from gateway.knowledge import services
from gateway.knowledge.models import VectorStore, VectorStoreFile
from sentinel.console.scoping import TenantFilter, TenantScopedAdmin, TenantScopedInline
from sentinel.text import CONTROL, PlainTextForm
from tenants.selectors import MANAGE


class VectorStoreForm(PlainTextForm, forms.ModelForm):
    document = forms.FileField(
        required=False,
        help_text="Add a document: Markdown or plain text (UTF-8), HTML or PDF. A worker reads, chunks and "
        "embeds it; its status is in the list of files below.",
    )

    class Meta:
        model = VectorStore
        fields = ["tenant", "name", "description"]

    def clean_document(self):
        upload = self.cleaned_data.get("document")
        if upload is not None and upload.size > settings.BATCH_MAX_FILE_BYTES:
            raise ValidationError(f"The file is larger than {settings.BATCH_MAX_FILE_BYTES} bytes.")
        return upload


class VectorStoreFileInline(TenantScopedInline, TabularInline):
    model = VectorStoreFile
    extra = 0
    fields = ["filename", "status", "chunks", "usage_bytes", "error", "created_at"]
    readonly_fields = fields
    can_delete = True  # taking a file out of the store: its chunks go with it
    verbose_name = "document"
    verbose_name_plural = "documents"

    def has_add_permission(self, request, obj):
        return False  # documents are added with the form's upload field

    def has_change_permission(self, request, obj=None):
        return False

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("file")

    @admin.display(description="file")
    def filename(self, obj):
        return f"{obj.file.filename} ({obj.file.public_id})"

    @admin.display(description="last error")
    def error(self, obj):
        return (obj.last_error or {}).get("message", "")


class VectorStoreAdmin(TenantScopedAdmin):
    """A tenant's vector stores (docs/knowledge.md), for its admins."""

    form = VectorStoreForm
    view_roles = MANAGE
    list_display = ["public_id", "name", "tenant", "files", "completed", "failed", "usage", "created_at"]
    list_filter = [TenantFilter]
    list_select_related = ["tenant"]
    search_fields = ["public_id", "name"]
    inlines = [VectorStoreFileInline]
    actions = ["reindex"]

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .annotate(
                file_count=Count("files"),
                completed_count=Count("files", filter=Q(files__status=VectorStoreFile.Status.COMPLETED)),
                failed_count=Count("files", filter=Q(files__status=VectorStoreFile.Status.FAILED)),
                usage_bytes=Sum("files__usage_bytes"),
            )
        )

    def get_readonly_fields(self, request, obj=None):
        # A store never moves to another tenant: its documents are that tenant's.
        return ["tenant", "public_id", "created_at"] if obj is not None else ["public_id", "created_at"]

    def get_fields(self, request, obj=None):
        return ["tenant", "public_id", "name", "description", "document", "created_at"]

    @admin.display(description="files", ordering="file_count")
    def files(self, obj):
        return obj.file_count

    @admin.display(description="ingested", ordering="completed_count")
    def completed(self, obj):
        return obj.completed_count

    @admin.display(description="failed", ordering="failed_count")
    def failed(self, obj):
        return obj.failed_count

    @admin.display(description="text bytes", ordering="usage_bytes")
    def usage(self, obj):
        return obj.usage_bytes or 0

    def save_model(self, request, obj, form, change):
        super().save_model(request, obj, form, change)
        upload = form.cleaned_data.get("document")
        if upload is None:
            return
        content = upload.read()
        filename = CONTROL.sub("", upload.name or "")[:255] or "document"
        file = BatchFile.objects.create(
            tenant_id=obj.tenant_id,
            purpose=BatchFile.Purpose.ASSISTANTS,
            filename=filename,
            bytes=len(content),
            content=content,
        )
        try:
            services.file_add(store=obj, file=file, attributes={})
        except services.QuotaExceeded as exc:
            file.delete()
            self.message_user(request, f"{filename} was not added: {exc}", messages.ERROR)
            return
        self.message_user(request, f"{filename} is being ingested.", messages.SUCCESS)

    def delete_model(self, request, obj):
        services.store_delete(store=obj)

    def delete_queryset(self, request, queryset):  # the list's "delete selected": each as one delete
        for store in queryset:
            services.store_delete(store=store)

    @admin.action(
        description="Re-index selected stores (every document read and embedded again)", permissions=["change"]
    )
    def reindex(self, request, queryset):
        # response_action has already narrowed the selection to the tenants the user manages.
        entries = list(VectorStoreFile.objects.filter(store__in=queryset).select_related("store", "file"))
        for entry in entries:
            services.file_add(store=entry.store, file=entry.file, attributes=entry.attributes)
        self.message_user(request, f"Re-indexing {len(entries)} document(s).", messages.SUCCESS)
