"""One exception type for every message the ROS layer refuses to feed the policy.

A robot must not act on a frame it misread, so conversions refuse bad input instead of
guessing. Each refusal carries a short, stable ``reason`` code: the node counts refusals
per reason and per source in its status topic, so an operator sees *why* inputs are
dropped (``bad_encoding`` on ``/cam/wrist``) without reading logs. The codes are module
constants so the node, the status message and the tests spell them the same way.
"""

from __future__ import annotations

BAD_ENCODING = "bad_encoding"
"""Image encoding (or compressed format) this package does not convert."""
BAD_SIZE = "bad_size"
"""Zero height/width, ``step`` too small, data longer than ``step*height``, not the configured
size (or the size the camera started with), too thin for the model's input; a JointState with
more positions than names."""
TRUNCATED_DATA = "truncated_data"
"""Fewer bytes (or joint positions) than the header/name list promises."""
DECODE_FAILED = "decode_failed"
"""A compressed image that the decoder could not read."""
NON_FINITE_IMAGE = "non_finite_image"
"""A float (``32FC1``) frame that is NaN at every pixel: a depth camera with no reading anywhere.
Some NaN pixels are a depth image's way to say "no reading there" (they become 0), and +/-inf
are readings (REP 117: nothing in range / too close); NaN alone leaves nothing to see."""
MISSING_JOINT = "missing_joint"
"""A configured joint name is not in the JointState message."""
DUPLICATE_JOINT = "duplicate_joint"
"""A configured joint name appears more than once in the JointState message."""
NON_FINITE_JOINT = "non_finite_joint"
"""A configured joint's position is NaN or infinite."""
UNSTAMPED = "unstamped"
"""Header stamp is zero, or its nanosec field is not below 1e9: the time it means is unknown."""
STALE = "stale"
"""Header stamp is older than the configured maximum age."""
FUTURE_STAMP = "future_stamp"
"""Header stamp is ahead of the node's clock by more than the maximum age (clocks
disagree, e.g. sim time on one side only)."""

REASONS: frozenset[str] = frozenset(
    {
        BAD_ENCODING,
        BAD_SIZE,
        TRUNCATED_DATA,
        DECODE_FAILED,
        NON_FINITE_IMAGE,
        MISSING_JOINT,
        DUPLICATE_JOINT,
        NON_FINITE_JOINT,
        UNSTAMPED,
        STALE,
        FUTURE_STAMP,
    }
)
"""Every reason code an ``InputError`` may carry (the status topic's counter keys)."""


class InputError(ValueError):
    """An input message that cannot be converted into policy input.

    ``reason`` is one of :data:`REASONS`; ``source`` names the topic or field the
    message came from; ``detail`` says what was wrong and what was expected. ``str()``
    gives ``"[reason] source: detail"`` so a log line is self-explanatory.
    """

    def __init__(self, reason: str, source: str, detail: str) -> None:
        if reason not in REASONS:
            # A typo here would silently create a new status counter; fail loudly.
            raise ValueError(f"unknown InputError reason {reason!r}; known: {sorted(REASONS)}")
        self.reason = reason
        self.source = source
        self.detail = detail
        super().__init__(f"[{reason}] {source}: {detail}")

    def __reduce__(self):
        # Keep the exception picklable (e.g. across a worker process boundary).
        return (type(self), (self.reason, self.source, self.detail))
