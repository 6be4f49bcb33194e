"""DESIGN.md §2 as a test: layers depend downward only (ros -> engine -> policies -> adopt ->
kernels), and ROS modules (rclpy, launch, generated messages, ours too) stay in the ROS layer.
Every import in the package is read with `ast` (function-level imports and constant
`import_module` / `__import__` names too), relative imports resolved, so a lazy import inside a
function cannot slip a layer violation past it; a part of the package without a rule fails."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flashrt_ros"

# unit -> the other flashrt_ros units it may import. The layers are subpackages; "package" is
# flashrt_ros/__init__.py (every import of a submodule runs it, so it imports nothing), "cli"
# is the `flashrt` command (runs without ROS).
ALLOWED = {
    "package": set(),
    "kernels": {"package"},
    "adopt": {"package", "kernels"},
    "policies": {"package", "adopt", "kernels"},
    "engine": {"package", "policies", "adopt", "kernels"},
    "bench": {"package", "engine", "policies", "adopt", "kernels"},
    "cli": {"package", "bench", "engine", "policies", "adopt", "kernels"},
    "ros": {"package", "engine", "policies", "adopt", "kernels"},
}
ROS_UNITS = {"ros"}  # the only units that may import ROS modules
ROS_TOPS = {"rclpy", "launch", "launch_ros", "ament_index_python", "rcl_interfaces", "builtin_interfaces"}
IMPORT_FUNCTIONS = {"import_module", "__import__"}


def is_ros(name: str) -> bool:
    """rclpy, launch, generated message / service modules (ours included): all need ROS."""
    top = name.split(".")[0]
    ours = name.split(".")[:2] in (["flashrt_ros", "msg"], ["flashrt_ros", "srv"])
    return ours or top in ROS_TOPS or top.startswith("rosidl") or top.endswith(("_msgs", "_srvs"))


def unit_of(module: str) -> str:
    """flashrt_ros.<layer>.x -> layer; flashrt_ros.cli -> cli; flashrt_ros(.__init__) -> package."""
    parts = module.split(".")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if len(parts) == 1:
        return "package"
    return parts[1]


def imported_modules(source: str, module: str) -> tuple[list[str], list[str]]:
    """(absolute names of everything `source`, the module `module`, imports; problems with its
    imports that cannot be resolved). Also seen: `importlib.import_module("...")` and
    `__import__("...")` with a constant name."""
    package = module.rsplit(".", 1)[0]  # the same for a package's __init__
    names, problems = [], []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    problems.append(f"{module} line {node.lineno}: relative import climbs out of flashrt_ros")
                    continue
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names += [f"{base}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if func in IMPORT_FUNCTIONS and isinstance(node.args[0].value, str):
                names.append(node.args[0].value)
    return names, problems


def violations(source: str, module: str) -> list[str]:
    """The layer rules this module's imports break, one line each."""
    unit = unit_of(module)
    names, found = imported_modules(source, module)
    for name in names:
        parts = name.split(".")
        if parts[0] == "kernels":
            found.append(f"{module} imports top-level `{name}` (the kernels are flashrt_ros.kernels)")
        if is_ros(name):
            if unit not in ROS_UNITS:
                found.append(f"{module} ({unit}) imports {name}, a ROS module (only {sorted(ROS_UNITS)} may)")
            continue
        if parts[0] != "flashrt_ros":
            continue
        target = "package" if len(parts) == 1 or parts[1] == "__version__" else parts[1]
        if target not in ALLOWED:
            found.append(f"{module} imports {name}: {target!r} is not a known part of flashrt_ros")
        elif target != unit and target not in ALLOWED[unit]:
            found.append(f"{module} ({unit}) imports {name} ({target}, not below it)")
    return found


def package_modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        out.append((".".join(rel.parts), path))
    return out


def test_every_layer_imports_only_below_it():
    modules = package_modules()
    units = {unit_of(name) for name, _ in modules}
    assert units == set(ALLOWED), (
        f"parts of flashrt_ros without a rule (or rules without a part): {units ^ set(ALLOWED)}"
    )
    broken = [line for name, path in modules for line in violations(path.read_text(), name)]
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("flashrt_ros.kernels.rope", "from ..policies import fused", "imports flashrt_ros.policies.fused"),
        ("flashrt_ros.engine.pipeline", "def f():\n    import rclpy\n", "imports rclpy, a ROS module"),
        ("flashrt_ros.engine.capsule", "from flashrt_ros.srv import ForkCapsule", "flashrt_ros.srv.ForkCapsule, a ROS"),
        ("flashrt_ros.policies.pi0", "from sensor_msgs.msg import Image", "sensor_msgs.msg.Image, a ROS module"),
        ("flashrt_ros.policies.pi0", "from flashrt_ros.engine.stats import Stats", "(engine, not below it)"),
        ("flashrt_ros.policies.fused", "from kernels.rope import rope", "top-level `kernels.rope"),
        ("flashrt_ros.adopt.gates", "from flashrt_ros import ros", "imports flashrt_ros.ros (ros, not below"),
        ("flashrt_ros.adopt.gates", "import flashrt_ros.engine as e", "imports flashrt_ros.engine (engine"),
        ("flashrt_ros.adopt.__init__", "from .. import engine", "(adopt) imports flashrt_ros.engine"),
        ("flashrt_ros.__init__", "import rclpy", "(package) imports rclpy"),
        ("flashrt_ros.__init__", "from .kernels import rope", "(package) imports flashrt_ros.kernels.rope"),
        ("flashrt_ros.cli", "from .ros import node", "(cli) imports flashrt_ros.ros.node"),
        ("flashrt_ros.kernels.rope", "from flashrt_ros.cli import main", "(kernels) imports flashrt_ros.cli.main"),
        ("flashrt_ros.engine.x", "import importlib\nimportlib.import_module('flashrt_ros.ros.node')", "(engine) imp"),
        ("flashrt_ros.engine.x", "__import__('rclpy')", "(engine) imports rclpy"),
        ("flashrt_ros.engine.x", "from flashrt_ros.planner import plan", "'planner' is not a known part"),
        ("flashrt_ros.kernels.rope", "from ... import x", "relative import climbs out of flashrt_ros"),
    ],
)
def test_the_checker_catches_a_planted_violation(module, source, expected):
    """The rules above would pass vacuously if `violations` saw nothing: each planted import
    must be reported."""
    found = violations(source, module)
    assert any(expected in line for line in found), found


def test_allowed_imports_are_not_reported():
    assert violations("from .rope import qkv_rope\nimport torch\n", "flashrt_ros.kernels.fp8") == []
    assert violations("from ..kernels.rope import qkv_rope\n", "flashrt_ros.policies.fused") == []
    assert violations("import rclpy\nfrom ..engine import pipeline\n", "flashrt_ros.ros.node") == []
    assert violations("from flashrt_ros import __version__\n", "flashrt_ros.kernels.rope") == []
    assert violations("from .bench.reference import Case\n", "flashrt_ros.cli") == []
