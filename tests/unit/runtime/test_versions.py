"""The version order that picks a workflow's default version (engine.runtime.versions)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from engine.runtime.versions import newest, version_key


def test_digits_compare_as_numbers_and_text_as_text() -> None:
    ordered = ["", "1", "2", "10", "v1", "v1.9", "v1.10", "v2"]
    assert sorted(reversed(ordered), key=version_key) == ordered
    assert version_key("2024-01-31") < version_key("2024-02-01")
    assert newest(["1.9", "1.10", "1.2"]) == "1.10"
    assert newest(["", "beta"]) == "beta"


@given(st.lists(st.integers(min_value=0, max_value=10**12), min_size=1))
def test_numbered_versions_order_as_their_numbers(numbers: list[int]) -> None:
    assert newest(str(n) for n in numbers) == str(max(numbers))
    assert newest(f"v{n}" for n in numbers) == f"v{max(numbers)}"


@given(st.lists(st.text(alphabet="ab.-01239", max_size=8), min_size=1, max_size=6))
def test_the_order_is_total_and_the_empty_version_is_oldest(versions: list[str]) -> None:
    keyed = sorted(versions, key=version_key)  # comparable: never raises TypeError
    assert sorted(keyed, key=version_key) == keyed
    assert newest(versions) in versions
    assert all(version_key("") <= version_key(v) for v in versions)
    assert newest(versions) == newest(list(reversed(versions)))
