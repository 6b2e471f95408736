from django.urls import path, re_path

from gateway import views
from gateway.batches import views as batch_views
from gateway.knowledge import views as knowledge_views
from gateway.responses import views as response_views

urlpatterns = [
    path("v1/files", batch_views.files),
    path("v1/files/<str:file_id>", batch_views.file),
    path("v1/files/<str:file_id>/content", batch_views.file_content),
    path("v1/batches", batch_views.batches),
    path("v1/batches/<str:batch_id>", batch_views.batch),
    path("v1/batches/<str:batch_id>/cancel", batch_views.batch_cancel),
    path("v1/vector_stores", knowledge_views.stores),
    path("v1/vector_stores/<str:store_id>", knowledge_views.store),
    path("v1/vector_stores/<str:store_id>/files", knowledge_views.store_files),
    path("v1/vector_stores/<str:store_id>/files/<str:file_id>", knowledge_views.store_file),
    path("v1/vector_stores/<str:store_id>/search", knowledge_views.search),
    path("v1/responses/<str:response_id>", response_views.response),
    path("v1/responses/<str:response_id>/input_items", response_views.response_input_items),
    path("health/live", views.live),
    path("health/ready", views.ready),
    re_path(r"^v1/(?P<path>(?s:.*))$", views.not_found),
]
