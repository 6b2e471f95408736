"""Billing's part of the management API, mounted under /api/v1/."""

from django.urls import path

from billing.api import RequestLogApi, SpendReportApi

urlpatterns = [
    path("reports/spend", SpendReportApi.as_view(), name="spend-report"),
    path("tenants/<slug:slug>/requests", RequestLogApi.as_view(), name="tenant-requests"),
]
