"""Shared pytest set-up.

- DDS stays on this machine and each run has its own domain id: ROS_AUTOMATIC_DISCOVERY_RANGE
  and ROS_DOMAIN_ID are set before any test runs (if not set already, e.g. by scripts/test.sh).
- Tests marked `ros` skip, with the reason, when rclpy or our generated interfaces cannot be
  imported, unless FLASHRT_REQUIRE_ROS=1 (scripts/test.sh, CI): then they run and fail.
- Tests marked `gpu` skip when torch sees no CUDA device; without one, Triton kernels run in
  its interpreter (TRITON_INTERPRET=1, set before any test module imports triton).

Fixtures: `ros_env` (session; the environment for subprocesses that use ROS),
`rclpy_context` (a fresh, initialised rclpy context, shut down afterwards) and
`ros_module_context` (the same, shared by a test module).
"""

import contextlib
import functools
import os

import pytest

GPU_SKIP_REASON = "no CUDA GPU (CI has none); run scripts/gpu_check.sh on the device machine"


def _set_ros_env(env) -> None:
    env.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
    env.setdefault("ROS_DOMAIN_ID", str(60 + os.getpid() % 42))  # 60-101 (see scripts/test.sh)


@functools.cache
def ros_import_error() -> str | None:
    """None if rclpy and flashrt_ros.msg/.srv import, else why not."""
    try:
        import flashrt_ros.msg  # noqa: F401
        import flashrt_ros.srv  # noqa: F401
        import rclpy  # noqa: F401
    except Exception as exc:  # ImportError, or a typesupport library that does not load
        return f"{type(exc).__name__}: {exc}"
    return None


def ros_skip_reason() -> str | None:
    """Why `ros` tests skip here, or None: they run where rclpy and the interfaces import, and
    always under FLASHRT_REQUIRE_ROS=1 (where a missing ROS is a failure, not a skip)."""
    if os.environ.get("FLASHRT_REQUIRE_ROS") == "1" or not ros_import_error():
        return None
    return (
        f"rclpy / flashrt_ros interfaces not importable ({ros_import_error()}); "
        "run scripts/setup_env.sh and source scripts/env.sh"
    )


@functools.cache
def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_configure(config):
    # Before any test module is imported, so that no rclpy context can start without it, and
    # so that Triton kernels run in its interpreter on machines without a GPU (CI).
    _set_ros_env(os.environ)
    if not _cuda_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    ros_reason = ros_skip_reason()
    for item in items:
        if "ros" in item.keywords and ros_reason:
            item.add_marker(pytest.mark.skip(reason=ros_reason))
        if "gpu" in item.keywords and not _cuda_available():
            item.add_marker(pytest.mark.skip(reason=GPU_SKIP_REASON))


@pytest.fixture(scope="session", autouse=True)
def ros_env() -> dict[str, str]:
    """ROS discovery kept on this machine, a per-run domain id; a copy of the environment with
    them, for subprocesses (pass as `env=`)."""
    _set_ros_env(os.environ)
    return dict(os.environ)


@contextlib.contextmanager
def _initialised_context():
    reason = ros_skip_reason()
    if reason:
        pytest.skip(reason)
    import rclpy
    from rclpy.context import Context

    context = Context()
    rclpy.init(context=context)
    try:
        yield context
    finally:
        context.try_shutdown()


@pytest.fixture
def rclpy_context(ros_env):
    """A fresh, initialised rclpy Context; shut down after the test."""
    with _initialised_context() as context:
        yield context


@pytest.fixture(scope="module")
def ros_module_context(ros_env):
    """One initialised rclpy Context shared by a test module (a node process per module)."""
    with _initialised_context() as context:
        yield context
