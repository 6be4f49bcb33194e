"""flashrt_node whose every decision takes SLOW_DECIDE_S seconds more (a slow robot computer),
and whose warm-up SLOW_WARM_UP_S more (a graph capture): `python -m slow_policy_node --ros-args ...`
with this folder on PYTHONPATH. For tests of what happens while a decision is in flight or the
pipeline is built, which the tiny policy's few milliseconds leave no room for."""

import os
import sys
import time

from flashrt_ros.engine import pipeline

_decide = pipeline.Pipeline.decide


def _slow_decide(self, *args, **kwargs):
    time.sleep(float(os.environ.get("SLOW_DECIDE_S", "1.0")))
    return _decide(self, *args, **kwargs)


pipeline.Pipeline.decide = _slow_decide
_warm_up = pipeline.Pipeline.warm_up


def _slow_warm_up(self, *args, **kwargs):
    time.sleep(float(os.environ.get("SLOW_WARM_UP_S", "0.0")))
    return _warm_up(self, *args, **kwargs)


pipeline.Pipeline.warm_up = _slow_warm_up

if __name__ == "__main__":
    from flashrt_ros.ros.node import main

    sys.exit(main())
