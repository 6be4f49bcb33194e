"""Lists in messages, bounded: the first few names and how many more.

A refusal that names every tensor of a mismatched checkpoint, every capsule kept or every section
of a params file would hide its point in a wall of names; the count says the rest.
"""

from __future__ import annotations


def bounded(items: list[str], limit: int, what: str = "") -> list[str]:
    """The first `limit` items, then "and N more<what>" if there are more."""
    return items[:limit] + ([f"and {len(items) - limit} more{what}"] if len(items) > limit else [])


def some(items: list[str], limit: int) -> str:
    """`bounded` as one comma list: "a, b, and 3 more"."""
    return ", ".join(bounded(items, limit))
