"""Budget periods: the UTC calendar day or month a moment falls in (admission reserves against it, the
budget alerts and reports count spend in it)."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta


def period_bounds(period: str, now: datetime) -> tuple[date, datetime]:
    """The UTC calendar period containing `now`: its first day and the moment it ends."""
    today = now.date()
    if period == "daily":
        return today, datetime.combine(today + timedelta(days=1), datetime.min.time(), UTC)
    first = today.replace(day=1)
    following = (first + timedelta(days=32)).replace(day=1)
    return first, datetime.combine(following, datetime.min.time(), UTC)
