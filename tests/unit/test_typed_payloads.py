"""Typed payloads: dataclasses, pydantic models, enums, dates and containers go out as
plain JSON and come back as the annotated type; conversion is a pure function of bytes and
annotation, so replay gives the same value."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.errors import CodecError
from engine.core.payloads import from_payload, to_payload
from engine.core.typed import convert, parameter_type, return_type


class Tier(enum.Enum):
    GOLD = "gold"
    BASIC = "basic"


@dataclass(frozen=True)
class Line:
    sku: str
    quantity: int = 1


@dataclass(frozen=True)
class Order:
    id: str
    amount: float
    lines: list[Line] = field(default_factory=list)
    tier: Tier = Tier.BASIC
    placed: datetime | None = None
    ref: uuid.UUID | None = None
    notes: dict[str, str] = field(default_factory=dict)


class Receipt(pydantic.BaseModel):
    charge_id: str
    total: float
    lines: list[int]


def charge(order: Order) -> Receipt:
    raise NotImplementedError


async def checkout(ctx: Any, order: Order) -> tuple[Receipt, Tier]:
    raise NotImplementedError


def _round_trip(value: Any, hint: Any) -> Any:
    return convert(from_payload(to_payload(value)), hint)


def test_a_dataclass_goes_out_as_json_and_comes_back() -> None:
    order = Order(
        "o-1",
        10.0,
        [Line("a"), Line("b", 3)],
        Tier.GOLD,
        datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC),
        uuid.UUID(int=7),
        {"gift": "yes"},
    )
    payload = to_payload(order)
    assert from_payload(payload)["lines"] == [
        {"quantity": 1, "sku": "a"},
        {"quantity": 3, "sku": "b"},
    ]
    assert from_payload(payload)["tier"] == "gold"
    assert _round_trip(order, Order) == order


def test_a_pydantic_model_goes_out_as_json_and_comes_back() -> None:
    receipt = Receipt(charge_id="ch-1", total=12.0, lines=[1, 2])
    assert from_payload(to_payload(receipt)) == {
        "charge_id": "ch-1",
        "lines": [1, 2],
        "total": 12.0,
    }
    assert _round_trip(receipt, Receipt) == receipt


def test_signatures_give_the_types() -> None:
    assert parameter_type(charge, 0) is Order
    assert return_type(charge) is Receipt
    assert parameter_type(checkout, 1) is Order
    assert _round_trip(
        [{"charge_id": "c", "total": 1, "lines": []}, "gold"], return_type(checkout)
    ) == (
        Receipt(charge_id="c", total=1.0, lines=[]),
        Tier.GOLD,
    )


def test_unannotated_and_any_pass_through() -> None:
    def plain(x):  # type: ignore[no-untyped-def]
        return x

    value = {"a": [1, 2]}
    assert convert(value, parameter_type(plain, 0)) is value
    assert convert(value, Any) is value


def test_fields_added_by_a_newer_sender_are_ignored_and_defaults_fill_in() -> None:
    assert convert({"id": "o", "amount": 1, "coupon": "X"}, Order) == Order("o", 1.0)


@pytest.mark.parametrize(
    ("value", "hint", "words"),
    [
        ({"amount": 1}, Order, "missing field(s) id"),
        ("not an object", Order, "expected an object"),
        ({"id": "o", "amount": 1, "tier": "platinum"}, Order, "platinum"),
        ({"charge_id": "c"}, Receipt, "Receipt"),
        ("x", int, "expected int"),
        ([1, 2, 3], tuple[int, int], "expected 2 items"),
    ],
)
def test_a_payload_that_does_not_fit_is_a_codec_error(value: Any, hint: Any, words: str) -> None:
    with pytest.raises(CodecError, match="cannot read") as caught:
        convert(value, hint)
    assert words in str(caught.value)


def test_unencodable_values_still_say_what_to_pass() -> None:
    with pytest.raises(CodecError, match="dataclasses, pydantic models"):
        to_payload(object())


lines = st.builds(Line, st.text(max_size=5), st.integers(-5, 5))
orders = st.builds(
    Order,
    st.text(max_size=8),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.lists(lines, max_size=3),
    st.sampled_from(Tier),
    st.none() | st.datetimes(timezones=st.just(UTC)),
    st.none() | st.uuids(),
    st.dictionaries(st.text(max_size=3), st.text(max_size=3), max_size=2),
)


@given(orders)
def test_round_trip_is_exact_and_encoding_is_deterministic(order: Order) -> None:
    assert _round_trip(order, Order) == order
    assert to_payload(order) == to_payload(_round_trip(order, Order))
