"""Partitioned runs (Airflow 3.2+ asset partitions, AIP-76): the interval a run's partition key names.

A DAG scheduled by a *partitioned* timetable gets runs that carry a ``partition_key`` and no
data interval: :class:`~airflow.sdk.CronPartitionTimetable` (one key per cron tick, formatted
with its ``key_format``), backfills over partitions (``airflow backfill create`` on such a DAG:
one run per key), manual triggers with a key (REST API ``partition_key``), and
:class:`~airflow.sdk.PartitionedAssetTimetable` runs made per partition of their input assets.
The key then names the run's interval, decoded by the DAG's own timetable (never guessed):

* a cron partition timetable: ``[tick, next tick)`` where ``tick`` is the key parsed with the
  timetable's ``key_format`` and timezone. The key must be exactly what the timetable formats
  for that tick (``2024-1-2`` or an off-tick key are refused);
* a partitioned asset timetable: ``[period start, period end)`` of each input's temporal
  mapper (``StartOfHourMapper`` .. ``StartOfYearMapper``, also inside a rollup / fan-out
  mapper); every input's mapper must name the same interval.

Anything else (``PartitionedAtRuntime``, keys without time such as ``IdentityMapper``'s, a
partition key on a non-partitioned DAG) has no interval: :class:`InvalidUsageError`, naming
the key and the expected format, before anything is written.

SUBTLE: Airflow's trigger API parses a key leniently (``2024-1-2`` gets January 2nd's
``partition_date``) and a backfill skips a partition whose date an unfinished run already
has ("in flight"). Such a run is refused here (the key is not the one the timetable
formats), but while it is unfinished it keeps a backfill from creating that day's run.

The factories' helpers: :func:`daily_partitions` / :func:`hourly_partitions` (the ingest
DAG's ``schedule=``) and :class:`InputPartitions` (the view DAG's ``schedule=``: one run per
partition of its inputs). Each run's asset events carry its key (Airflow stamps the run's
``partition_key`` on every outlet event).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from dateutil.relativedelta import relativedelta

from shardsink.errors import InvalidUsageError

#: The key formats of :func:`daily_partitions` and :func:`hourly_partitions`.
DAILY_KEY = "%Y-%m-%d"
HOURLY_KEY = "%Y-%m-%dT%H"
#: The period of each temporal partition mapper of Airflow (by class name: SDK and core classes differ).
_MAPPER_PERIODS = {"StartOfHourMapper": relativedelta(hours=1), "StartOfDayMapper": relativedelta(days=1),
                   "StartOfWeekMapper": relativedelta(weeks=1), "StartOfMonthMapper": relativedelta(months=1),
                   "StartOfQuarterMapper": relativedelta(months=3), "StartOfYearMapper": relativedelta(years=1)}
_PERIODS = {"hourly": ("0 * * * *", HOURLY_KEY, "StartOfHourMapper"),
            "daily": ("0 0 * * *", DAILY_KEY, "StartOfDayMapper")}
#: How far ahead the next cron tick is looked for (a yearly cron's next tick is within it).
_LOOKBACK = timedelta(days=2)  # how far before a key's date its tick may lie (DST)
_HORIZON = timedelta(days=400)


def _cron_partitions(period: str, timezone: str, run_offset: int) -> Any:
    from airflow.sdk import CronPartitionTimetable

    cron, key_format, _ = _PERIODS[period]
    return CronPartitionTimetable(cron, timezone=timezone, run_offset=run_offset, key_format=key_format)


def daily_partitions(*, timezone: str = "UTC", run_offset: int = -1) -> Any:
    """One partition per day, keyed ``YYYY-MM-DD`` (in ``timezone``): Airflow's
    ``CronPartitionTimetable("0 0 * * *", key_format="%Y-%m-%d")``. ``run_offset=-1`` (the
    default): the run made at the end of day D covers day D, as a daily data interval would."""
    return _cron_partitions("daily", timezone, run_offset)


def hourly_partitions(*, timezone: str = "UTC", run_offset: int = -1) -> Any:
    """One partition per hour, keyed ``YYYY-MM-DDTHH``; otherwise as :func:`daily_partitions`."""
    return _cron_partitions("hourly", timezone, run_offset)


@dataclass(frozen=True, kw_only=True)
class InputPartitions:
    """A view DAG's ``schedule=``: one run per partition of its input shards (all inputs).

    ``period``: the inputs' partitions (``"daily"`` keys ``YYYY-MM-DD``, ``"hourly"``
    ``YYYY-MM-DDTHH``, as :func:`daily_partitions` / :func:`hourly_partitions` make them);
    the view run for key K covers K's interval once every input has an event for K.
    """

    period: Literal["daily", "hourly"] = "daily"
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        if self.period not in _PERIODS:
            raise InvalidUsageError(f"InputPartitions period {self.period!r} is not one of {sorted(_PERIODS)}",
                                    value=self.period)

    def timetable(self, assets: list[Any]) -> Any:
        """Airflow's ``PartitionedAssetTimetable`` on all of ``assets``, mapped by the period's mapper."""
        from airflow.sdk import AssetAll, PartitionedAssetTimetable, StartOfDayMapper, StartOfHourMapper

        _, key_format, mapper = _PERIODS[self.period]
        cls = StartOfDayMapper if mapper == "StartOfDayMapper" else StartOfHourMapper
        condition = assets[0] if len(assets) == 1 else AssetAll(*assets)
        return PartitionedAssetTimetable(assets=condition, default_partition_mapper=cls(
            timezone=self.timezone, input_format=key_format, output_format=key_format))


def _core(timetable: Any) -> Any:
    from airflow.serialization.encoders import coerce_to_core_timetable

    return coerce_to_core_timetable(timetable)


def _ms(value: datetime) -> int:
    return int(value.timestamp() * 1000)


def is_partitioned(timetable: Any) -> bool:
    """Whether ``timetable`` (an Airflow timetable, SDK or core) makes partitioned runs."""
    return bool(getattr(_core(timetable), "partitioned", False))  # a cron string, assets, None: not a timetable


def _refuse(key: str, why: str) -> InvalidUsageError:
    return InvalidUsageError(f"partition key {key!r}: {why}; nothing was written", value=key)


def _cron_interval(core: Any, key: str) -> tuple[int, int]:
    fmt = getattr(core, "_key_format", "?")
    try:
        start = core.resolve_partition_date(key)
    except ValueError as e:  # InvalidPartitionKeyError
        raise _refuse(key, f"does not parse with the DAG's key format {fmt!r}") from e
    # SUBTLE: search from before the key's own date: around a DST change the tick a key names
    # may lie before it (a midnight that does not exist), and one key may name two ticks (an
    # hour repeated when clocks go back), which is refused rather than half covered.
    matches: list[Any] = []
    nearest, after = None, None
    for info in core.iter_partition_dagrun_infos(earliest=start - _LOOKBACK, latest=start + _HORIZON):
        if info.partition_key == key:
            matches.append(info)
            if len(matches) > 1:
                break
            continue
        if matches:
            after = info
            break
        if nearest is None and info.partition_date >= start:
            nearest = info
        if info.partition_date > start + _LOOKBACK:
            break
    if not matches:
        want = f" (the nearest is {nearest.partition_key!r})" if nearest is not None else ""
        raise _refuse(key, f"is not a partition of the DAG's timetable: expected the format {fmt!r} at a "
                           f"cron tick{want}")
    if len(matches) > 1:
        raise _refuse(key, f"names more than one cron tick ({matches[0].partition_date.isoformat()} and "
                           f"{matches[1].partition_date.isoformat()}), not one interval per partition: the key "
                           f"format {fmt!r} is coarser than the cron, or a clock change repeats an hour (use a "
                           "key format with the UTC offset, %z, or a UTC timetable)")
    if after is None:
        raise _refuse(key, "its partition has no end within a year")
    return _ms(matches[0].partition_date), _ms(after.partition_date)


def _temporal(mapper: Any) -> Any:
    """The temporal mapper formatting a downstream key of ``mapper`` (None: keys carry no time)."""
    name = type(mapper).__name__
    if name in _MAPPER_PERIODS:
        return mapper
    if name == "RollupMapper":
        return _temporal(mapper.upstream_mapper)
    if name == "FanOutMapper":
        return _temporal(mapper.downstream_mapper)
    return None


def _mapper_interval(mapper: Any, key: str) -> tuple[int, int]:
    temporal = _temporal(mapper)
    if temporal is None:
        raise _refuse(key, f"the partition mapper {type(mapper).__name__} gives keys no time; schedule the "
                           "view with temporal mappers (e.g. shardsink's InputPartitions or StartOfDayMapper)")
    fmt = temporal.output_format
    try:
        start = temporal.to_partition_date(key)
    except ValueError as e:
        raise _refuse(key, f"does not parse with the mapper's output format {fmt!r}") from e
    if temporal.format(start) != key:
        raise _refuse(key, f"is not in the canonical form of the mapper's output format {fmt!r} "
                           f"(expected {temporal.format(start)!r})")
    return _ms(start), _ms(start + _MAPPER_PERIODS[type(temporal).__name__])


def _asset_mappers(core: Any) -> list[Any]:
    cond = core.asset_condition
    out = [core.get_partition_mapper(name=k.name, uri=k.uri) for k, _ in cond.iter_assets()]
    for ref in cond.iter_asset_refs():
        out.append(core.get_partition_mapper(name=getattr(ref, "name", ""), uri=getattr(ref, "uri", "")))
    return out or [core.default_partition_mapper]


def partition_interval(timetable: Any, key: str) -> tuple[int, int]:
    """The interval ``[lower, upper)`` in ms that partition ``key`` names under ``timetable`` (the
    DAG's, SDK or core); InvalidUsageError naming the key and the expected format when it names none."""
    if not isinstance(key, str) or not key.strip():
        raise InvalidUsageError(f"partition key {key!r} is not a non-empty string", value=key)
    core = _core(timetable)
    if getattr(core, "partitioned_at_runtime", False):
        raise _refuse(key, "partitions chosen at runtime (PartitionedAtRuntime) name no interval")
    if not getattr(core, "partitioned", False):
        raise _refuse(key, f"the DAG's schedule ({type(core).__name__}) is not partitioned, so the key names no "
                           "interval; schedule it with a partition timetable (e.g. daily_partitions())")
    if hasattr(core, "iter_partition_dagrun_infos") and hasattr(core, "_key_format"):
        return _cron_interval(core, key)
    if hasattr(core, "asset_condition"):
        got = {_mapper_interval(m, key) for m in _asset_mappers(core)}
        if len(got) != 1:
            raise _refuse(key, f"the inputs' partition mappers name different intervals {sorted(got)}")
        return got.pop()
    raise _refuse(key, f"the timetable {type(core).__name__} does not say what its keys' intervals are")


def check_partition_schedule(timetable: Any, *, start_date: datetime) -> None:
    """At DAG parse time: a partitioned ``timetable`` must name an interval for its keys (its
    first key after ``start_date`` decodes back to its tick, and consecutive keys differ).
    A non-partitioned one passes. InvalidUsageError names what is wrong."""
    core = _core(timetable)
    if getattr(core, "partitioned_at_runtime", False):
        raise InvalidUsageError("a shardsink DAG cannot be PartitionedAtRuntime: its keys name no interval",
                                value=type(timetable).__name__)
    if not is_partitioned(core):
        return
    if not hasattr(core, "iter_partition_dagrun_infos") or not hasattr(core, "_key_format"):
        return  # asset-partitioned: checked per key at run time (mappers decide)
    begin = start_date if start_date.tzinfo else start_date.replace(tzinfo=UTC)
    ticks = list(itertools.islice(core.iter_partition_dagrun_infos(earliest=begin, latest=begin + _HORIZON), 2))
    if len(ticks) < 2:
        raise InvalidUsageError("the partition timetable has fewer than two partitions within a year of start_date",
                                value=str(start_date))
    for tick in ticks:  # each key decodes back to its own tick: distinct keys name distinct intervals
        lower, upper = partition_interval(core, tick.partition_key)
        if lower != _ms(tick.partition_date) or upper <= lower:
            raise InvalidUsageError(
                f"the partition timetable's key format {getattr(core, '_key_format', '?')!r} does not name one "
                f"interval per partition: key {tick.partition_key!r} of the partition at "
                f"{tick.partition_date.isoformat()} decodes to [{lower}, {upper})", value=tick.partition_key)
