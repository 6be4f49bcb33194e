"""DESIGN.md §2 as a test: layers depend downward only (ros -> engine -> policies -> adopt ->
kernels), and rclpy stays in the ROS layer. Every import statement in the package is read with
`ast` (function-level imports too), relative imports resolved, so a lazy import inside a
function cannot slip a layer violation past it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "flashrt_ros"

# layer -> the flashrt_ros layers it may import (besides itself)
ALLOWED = {
    "kernels": set(),
    "adopt": {"kernels"},
    "policies": {"adopt", "kernels"},
    "engine": {"policies", "adopt", "kernels"},
    "bench": {"engine", "policies", "adopt", "kernels"},
    "ros": {"engine", "policies", "adopt", "kernels"},
}
NO_RCLPY = {"kernels", "adopt", "policies", "engine", "bench"}


def imported_modules(source: str, module: str) -> list[str]:
    """Absolute names of everything `source` (the module `module`, dotted) imports."""
    package = module.rsplit(".", 1)[0]  # the same for a package's __init__
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def violations(source: str, module: str) -> list[str]:
    """The layer rules this module's imports break, one line each."""
    parts = module.split(".")
    layer = parts[1] if len(parts) > 2 else None  # flashrt_ros.<layer>.<module>
    found = []
    for name in imported_modules(source, module):
        top = name.split(".")
        if top[0] == "kernels":
            found.append(f"{module} imports top-level `{name}` (the kernels are flashrt_ros.kernels)")
        if layer is None:
            continue
        if top[0] == "rclpy" and layer in NO_RCLPY:
            found.append(f"{module} ({layer} layer) imports rclpy")
        if top[0] == "flashrt_ros" and len(top) > 1 and top[1] in ALLOWED and top[1] != layer:
            if top[1] not in ALLOWED[layer]:
                found.append(f"{module} ({layer} layer) imports {name} ({top[1]} layer, not below it)")
    return found


def package_modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        out.append((".".join(rel.parts), path))
    return out


def test_every_layer_imports_only_below_it():
    modules = package_modules()
    layers = {name.split(".")[1] for name, _ in modules if name.count(".") >= 2}
    assert {"kernels", "policies", "engine", "ros"} <= layers, f"layers found: {sorted(layers)}"
    broken = [line for name, path in modules for line in violations(path.read_text(), name)]
    assert not broken, "\n".join(broken)


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("flashrt_ros.kernels.rope", "from ..policies import fused", "imports flashrt_ros.policies.fused"),
        ("flashrt_ros.engine.pipeline", "def f():\n    import rclpy\n", "(engine layer) imports rclpy"),
        ("flashrt_ros.policies.pi0", "from flashrt_ros.engine.stats import Stats", "(engine layer, not below"),
        ("flashrt_ros.policies.fused", "from kernels.rope import rope", "top-level `kernels.rope"),
        ("flashrt_ros.adopt.gates", "from flashrt_ros import ros", "imports flashrt_ros.ros (ros layer"),
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
