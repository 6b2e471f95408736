"""Websocket routes (Channels). The console's live views subscribe here."""

websocket_urlpatterns: list = []
