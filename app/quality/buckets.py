"""Time in the agreement figures: seconds spent kept in tenths (and their medians), and the trend's calendar
buckets (hours, days and weeks since 1970, UTC; weeks from Monday), so every bucket is the same whoever counts it."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

HOUR, DAY, WEEK = 3600, 86400, 7 * 86400
_MONDAY = 4 * DAY
"""1970-01-01 was a Thursday: weeks are counted from Monday 1970-01-05."""
PERIODS = (("h", "hour", 3 * DAY), ("d", "day", 120 * DAY), ("w", "week", math.inf))
"""(kind, unit, span up to which it draws the trend): a campaign of an afternoon is drawn by the hour, one of a
quarter by the day, anything longer by the week, so a chart has tens of points rather than one or thousands."""


def tenth(seconds: float) -> int:
    """Seconds in tenths, rounded half up: the precision the medians are kept (and shown) at."""
    return math.floor(seconds * 10 + 0.5)


def median_of_tenths(values: Sequence[int]) -> float | None:
    """The median of times kept in tenths of a second, in seconds."""
    return statistics.median(values) / 10 if values else None


def _epoch(at: datetime) -> int:
    return math.floor((at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp())


def hour_of(at: datetime) -> int:
    return _epoch(at) // HOUR


def key_of(kind: str, at: datetime) -> int:
    """The bucket of `at` in `kind` ("h", "d" or "w")."""
    ts = _epoch(at)
    return ts // HOUR if kind == "h" else ts // DAY if kind == "d" else (ts - _MONDAY) // WEEK


def periods(at: datetime | None) -> tuple[str, ...]:
    """The trend's keys of a moment, as the kept totals name them: "h:<hour>", "d:<day>", "w:<week>"."""
    if at is None:
        return ()
    return tuple(f"{kind}:{key_of(kind, at)}" for kind, _, _ in PERIODS)


def unit_of(first_hour: int, last_hour: int) -> tuple[str, str]:
    """(kind, unit) the trend is drawn in, from the first and last hour with rankings."""
    span = (last_hour - first_hour) * HOUR
    return next((kind, unit) for kind, unit, limit in PERIODS if span <= limit)


def first_key(kind: str, first_hour: int) -> int:
    """The bucket, in `kind`, that holds the first hour: the trend's x is counted from it."""
    return key_of(kind, datetime(1970, 1, 1, tzinfo=UTC) + timedelta(hours=first_hour))


def label(kind: str, key: int) -> str:
    """The bucket's start, as the chart says it (UTC)."""
    seconds = key * HOUR if kind == "h" else key * DAY if kind == "d" else key * WEEK + _MONDAY
    start = datetime(1970, 1, 1, tzinfo=UTC) + timedelta(seconds=seconds)
    return start.strftime("%Y-%m-%d %H:00" if kind == "h" else "%Y-%m-%d")
