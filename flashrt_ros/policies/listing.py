"""Lists and values in messages, bounded: the first few names and how many more, a long value cut.

A refusal that names every tensor of a mismatched checkpoint, every capsule kept or every section
of a params file would hide its point in a wall of names; the count says the rest. A refusal that
quotes a 200 000-character prompt whole goes as such into the service reply and the log.
"""

from __future__ import annotations


def bounded(items: list[str], limit: int, what: str = "") -> list[str]:
    """The first `limit` items, then "and N more<what>" if there are more."""
    return items[:limit] + ([f"and {len(items) - limit} more{what}"] if len(items) > limit else [])


def some(items: list[str], limit: int) -> str:
    """`bounded` as one comma list: "a, b, and 3 more"."""
    return ", ".join(bounded(items, limit))


def shown(value: object, limit: int = 80) -> str:
    """A value as a message quotes it: repr, cut past `limit` characters with its length said."""
    text = repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value)} characters" if isinstance(value, str) else f"{len(text)} characters as text"
    return f"{text[:limit]}... ({size})"
