"""Websocket routes (Channels). The console's live views subscribe here."""

from django.urls import path

from sentinel.console.consumers import ConsoleConsumer

websocket_urlpatterns: list = [path("ws/console/", ConsoleConsumer.as_asgi())]
