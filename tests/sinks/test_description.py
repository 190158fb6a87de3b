"""Descriptions cross process boundaries as plain JSON values with a format, decoded once, typed."""

from __future__ import annotations

import json

import pytest

from shardsink.core.commits import Listing
from shardsink.errors import InvalidUsageError
from shardsink.sinks.description import (
    DESCRIPTION_FORMAT,
    Description,
    NoOp,
    descriptions,
    make_desc_id,
    run_of,
    to_builtins,
)


def test_a_description_travels_as_json_values_and_back() -> None:
    d = Description(make_desc_id("d", "r", 1), 10, 20, 1, (0, 5))
    value = to_builtins([d])
    assert json.loads(json.dumps(value)) == value  # what Airflow's XCom stores
    assert value == [{"desc_id": d.desc_id, "lower": 10, "upper": 20, "attempt": 1, "corrects": [0, 5],
                      "format": DESCRIPTION_FORMAT, "listing": None}]
    assert descriptions(value) == [d] and Description.decode(value[0]) == d
    # A landing mint's description carries the listing its plan was made from, to its commit.
    listed = Description("x", 0, 5, 1, listing=Listing(at=1_700_000_000.0, held=(("dt=1/a b.csv", 1_700_000_000.0),)))
    assert Description.decode(json.loads(json.dumps(to_builtins(listed)))) == listed


def test_values_without_a_format_or_with_unknown_fields_still_decode() -> None:
    # pushed before descriptions carried a format (a run in flight across an upgrade), or by a newer writer
    old = {"desc_id": "x", "lower": 1, "upper": 2, "attempt": 3, "corrects": None}
    assert Description.decode(old) == Description("x", 1, 2, 3)
    assert Description.decode({**old, "added_later": [1]}) == Description("x", 1, 2, 3)


@pytest.mark.parametrize(("value", "names"), [
    ([{"desc_id": "x", "lower": 0, "upper": "5", "attempt": 1}], "$[0].upper"),
    ([{"desc_id": "x", "lower": 0, "attempt": 1}], "upper"),
    ([{"desc_id": "x", "lower": 0, "upper": 5, "attempt": 1, "corrects": [1]}], "$[0].corrects"),
    ({"desc_id": "x"}, "array"),
])
def test_a_malformed_value_is_refused_naming_the_field(value: object, names: str) -> None:
    with pytest.raises(InvalidUsageError, match="XCom of mint is malformed") as e:
        descriptions(value, what="XCom of mint")
    assert names in str(e.value)


def test_a_newer_format_is_refused_naming_it() -> None:
    with pytest.raises(InvalidUsageError, match=r"format 2; this shardsink reads formats 1\.\.1.*upgrade"):
        descriptions([{"desc_id": "x", "lower": 0, "upper": 5, "attempt": 1, "format": 2}])


def test_the_dict_codecs_are_deprecated_aliases_for_one_release() -> None:
    d = Description("x", 0, 5, 2)
    with pytest.warns(DeprecationWarning, match="to_builtins"):
        raw = d.to_dict()
    assert raw == to_builtins(d)
    with pytest.warns(DeprecationWarning, match=r"Description\.decode"):
        assert Description.from_dict(raw) == d


def test_a_no_op_is_a_struct_with_its_reason() -> None:
    n = NoOp("nothing to do", 5, None, 7)
    assert to_builtins(n) == {"reason": "nothing to do", "shard_upper": 5, "watermark": None, "interval_end": 7,
                              "format": DESCRIPTION_FORMAT}


@pytest.mark.parametrize("run_id", ["backfill__2025-03-01", "scheduled__2025-03-01T00:00:00+00:00", "a-a1-a", "r"])
def test_run_of_names_the_run_whatever_the_random_tail_starts_with(run_id: str) -> None:
    slug = make_desc_id("d", run_id, 1).rsplit("-a1-", 1)[0][2:]
    for tail in ("a5bcc000", "0a1b2c3d", "aaaaaaaa"):
        assert run_of(f"d-{slug}-a1-{tail}", "d") == slug
        assert run_of(f"d-{slug}-a12-{tail}", "d") == slug
    assert run_of(make_desc_id("d", run_id, 3), "d") == slug
    assert run_of(f"d-{slug}-a1-zz", "d") is None and run_of(f"e-{slug}-a1-a5bcc000", "d") is None
