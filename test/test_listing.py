"""policies/listing.py: how messages quote values and lists (bounded, so a reply stays short)."""

from __future__ import annotations

from flashrt_ros.policies.listing import bounded, shown, some


def test_a_list_at_its_limit_is_shown_whole_and_a_longer_one_says_how_many_more() -> None:
    assert bounded(["a", "b"], 2) == ["a", "b"]
    assert bounded(["a", "b", "c"], 2, " joints") == ["a", "b", "and 1 more joints"]
    assert some(["'a'", "'b'", "'c'", "'d'"], 2) == "'a', 'b', and 2 more"


def test_a_value_at_its_limit_is_quoted_whole_and_a_longer_one_cut_with_its_length() -> None:
    assert shown("x" * 78, limit=80) == repr("x" * 78)  # 80 characters with the quotes
    assert shown("x" * 79, limit=80) == repr("x" * 79)[:80] + "... (79 characters)"
    assert shown(list(range(40)), limit=10).endswith("... (150 characters as text)")
