"""Adoption: our kernels in unmodified PyTorch models, each kept only behind a parity and a speed gate.

    from flashrt_ros.adopt import accelerate
    report = accelerate(model, lambda: model(**inputs))
    print(report.table())   # what was replaced, its parity and speed-up, what was not and why
    report.revert()         # the model's own code again

See docs/adopt.md. This layer sits on the kernels only (DESIGN.md §2): it never imports the
policies, the engine or rclpy.
"""

from .accelerate import AdoptReport, Verdict, accelerate
from .gate import Gates, Parity
from .replacements import REPLACEMENTS, Replacement, by_name

__all__ = ["REPLACEMENTS", "AdoptReport", "Gates", "Parity", "Replacement", "Verdict", "accelerate", "by_name"]
