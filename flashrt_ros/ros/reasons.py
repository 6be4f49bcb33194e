"""The reasons ~/status counts node-wide events and skipped decisions by, and the node's rules
for ROS time; shared by the node's parts (ros/node*.py)."""

from flashrt_ros.ros.clock_watch import CLOCK_JUMPED_BACK

ABSENT = "absent"
"""Decision-time reason: no good message has arrived on the topic (since start or reset)."""
POLICY_ERROR = "policy_error"
PROMPT_TOO_LONG = "prompt_too_long"
NON_FINITE_ACTION = "non_finite_action"
"""The policy produced NaN / inf actions: nothing was published."""
INVALID_PARAMETER = "invalid_parameter"
"""A runtime parameter change that was refused (the old value stays in use)."""
UNKNOWN_PARAMETER = "unknown_parameter"
"""A parameter given at start that the node does not know (a typo in the params file?)."""
ACTION_CLAMPED = "action_clamped"
"""A chunk that action_lower_limits / action_upper_limits / action_max_step changed (published limited)."""
COMMAND_LIMITED = "command_limited"
"""The command stream held the commands to action_max_step per step (once per chunk)."""
INVALID_PROMPT = "invalid_prompt"
"""A message on prompt_topic that cannot be the prompt (empty, too long for the policy): not set."""
MAX_PROMPT_CHARS = 4096
"""Longer messages on prompt_topic are refused before they are tokenised (no policy takes them)."""
CHUNK_EXHAUSTED = "chunk_exhausted"
"""The command stream reached the end of its chunk with no newer one: no command (once per chunk)."""
CHUNK_ENDED = "chunk_ended"
"""A chunk published whose last point was already past (joint_trajectory_controller refuses it)."""
INCOMPATIBLE_SUBSCRIBER = "incompatible_subscriber"
"""A subscriber on one of the node's outputs that asked for what the publisher does not give
(transient_local durability, a deadline): it receives nothing (counted on the output's topic)."""
MIN_JUMP_BACK_S = 0.001
"""ROS time going back by less is not a jump (rcl reports every backward step: two /clock sources)."""
MIN_JUMP_FORWARD_S = 0.1
"""ROS time going forward by this much or more in one step is a jump (a /clock source that resynced
or skipped), not a tick of /clock (bag playback's 40 Hz, a simulator's frames): a decision it falls
in has no length on ROS time, for real-time chunking's takeover estimate nor for a deadline miss.
Unless such steps come regularly (TICK_REPEAT_S): then they are a coarse /clock's ticks."""
TICK_REPEAT_S = 1.0
"""A step forward of ROS time between half and twice the one before it, which came less than this
long ago (steady time), is a tick of a coarse /clock (10 Hz, a bag played with --clock 10), not a jump."""
DISCOVERY_S = 3.0
"""After the start, inputs absent for this long are an expected wait (DDS discovery), then a fault."""
NODE_ERROR = "node_error"
"""A failure of ours caught where it cannot stop the node: real-time chunking, the command stream,
the status, or a decision tick outside the policy (the policy's own is policy_error)."""
STOPS_DECISIONS = frozenset({POLICY_ERROR, PROMPT_TOO_LONG, NON_FINITE_ACTION, CLOCK_JUMPED_BACK})
"""The node-wide events that can stop a decision: /diagnostics names them (with the inputs that
did) as why none ran; a refused parameter, prompt or capsule call, a limited command or an
exhausted chunk stop none, or follow from the outage itself. A node_error stops one only where
the decision tick itself failed (counted apart: the command stream's and the status's do not). A
stalled clock is said by the clock watch while it lasts (a stall that has ended stops nothing)."""
