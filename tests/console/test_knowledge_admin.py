"""Knowledge bases in the console (gateway/knowledge/admin.py): a tenant's admins create a store,
upload a document into it and see it ingested, re-index and delete; nobody else sees the store."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from gateway.knowledge import services
from gateway.knowledge.models import Chunk, VectorStore, VectorStoreFile
from tests.console.conftest import as_user

LIST = "/admin/gateway/vectorstore/"


@pytest.fixture
def store(tenancy, embedding_model):
    """A store of tenant A with one ingested document, made through the console's upload."""
    t = tenancy
    web = as_user(t.owner)
    page = web.post(
        f"{LIST}add/",
        {
            "tenant": t.tenant.pk,
            "name": "Support",
            "description": "",
            "document": SimpleUploadedFile("faq.md", b"# Refunds\n\nRefunds arrive within 14 days."),
            "files-TOTAL_FORMS": "0",
            "files-INITIAL_FORMS": "0",
        },
    )
    assert page.status_code == 302, page.content.decode()[:3000]
    created = VectorStore.objects.get(tenant=t.tenant, name="Support")
    entry = VectorStoreFile.objects.get(store=created)
    assert (entry.status, entry.file.filename, entry.file.purpose) == ("in_progress", "faq.md", "assistants")
    services.ingest(entry.pk)  # what the worker the upload queued does
    return created


def test_a_tenant_admin_uploads_a_document_and_sees_it_ingested(tenancy, store):
    t = tenancy
    web = as_user(t.owner)
    listing = web.get(LIST).content.decode()
    assert store.public_id in listing and "Support" in listing
    page = web.get(f"{LIST}{store.pk}/change/").content.decode()
    assert "faq.md" in page and "completed" in page
    assert Chunk.objects.filter(store=store).count() == 1

    # Re-index: every document queued again.
    response = web.post(LIST, {"action": "reindex", "_selected_action": [store.pk]})
    assert response.status_code == 302
    assert VectorStoreFile.objects.get(store=store).status == "in_progress"

    # Deleting the store takes its chunks; the uploaded file stays.
    entry = VectorStoreFile.objects.get(store=store)
    assert web.post(f"{LIST}{store.pk}/delete/", {"post": "yes"}).status_code == 302
    assert not VectorStore.objects.filter(pk=store.pk).exists()
    assert not Chunk.objects.filter(store_id=store.pk).exists()
    assert type(entry.file).objects.filter(pk=entry.file_id).exists()


def test_nobody_else_sees_or_touches_the_store(tenancy, store):
    t = tenancy
    outsider = as_user(t.outsider)
    assert store.public_id not in outsider.get(LIST).content.decode()
    assert outsider.get(f"{LIST}{store.pk}/change/").status_code == 404
    assert outsider.post(f"{LIST}{store.pk}/delete/", {"post": "yes"}).status_code in (403, 404)
    # Finance and viewers of the same tenant do not manage knowledge bases.
    for member in (t.finance, t.viewer):
        assert as_user(member).get(LIST).status_code == 403
    # The store's tenant cannot be changed, even by its admin.
    web = as_user(t.owner)
    web.post(
        f"{LIST}{store.pk}/change/",
        {
            "tenant": t.other.pk,
            "name": "Moved",
            "description": "",
            "files-TOTAL_FORMS": "1",
            "files-INITIAL_FORMS": "1",
            "files-0-id": VectorStoreFile.objects.get(store=store).pk,
            "files-0-store": store.pk,
        },
    )
    store.refresh_from_db()
    assert (store.tenant_id, store.name) == (t.tenant.pk, "Moved")
    assert VectorStore.objects.filter(pk=store.pk).exists() and Chunk.objects.filter(store=store).count() == 1
