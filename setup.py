"""pip-installable library: engine, policies, kernels and the `flashrt` CLI, without colcon.

    pip install .            # the library (the ROS node additionally needs ROS 2: see README)

The ROS 2 package itself (interfaces, node executables, launch files) is built from the same
folder by colcon through CMakeLists.txt and package.xml; colcon picks package.xml (build type
ament_cmake) and ignores this file.

PyTorch is deliberately NOT in install_requires: robots bring their own build (JetPack's on
Jetson, a CUDA build on a workstation), and a plain `torch` requirement would make pip replace it
with a multi-GB generic wheel. Install the torch that fits the machine first. The development
set-up (scripts/setup_env.sh) pins the CPU build it tests with.
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent
VERSION = re.search(r'^__version__ = "([^"]+)"', (HERE / "flashrt_ros" / "__init__.py").read_text(), re.M).group(1)

setup(
    name="flashrt_ros",
    version=VERSION,
    description="Real-time vision-language-action policies (pi0, pi0.5) with fused GPU kernels, for ROS 2",
    packages=find_packages(include=["flashrt_ros", "flashrt_ros.*"]),
    python_requires=">=3.10",
    install_requires=[
        "numpy",
        "safetensors",
        "sentencepiece",
        "pyyaml",
        "tqdm",
    ],
    extras_require={
        # Decoding sensor_msgs/CompressedImage in the ROS node: PNG by Pillow, JPEG by simplejpeg (strict:
        # corrupt scan data is refused, where Pillow decodes it to garbage).
        "ros": ["pillow", "simplejpeg"],
        # Fused GPU kernels (Triton usually comes with a CUDA build of torch already).
        "triton": ["triton"],
        "test": ["pytest", "pytest-timeout", "pillow", "simplejpeg", "matplotlib"],
        # `flashrt bench`'s plot (the table and the JSON need nothing more).
        "bench": ["matplotlib"],
    },
    entry_points={"console_scripts": ["flashrt = flashrt_ros.cli:main"]},
    zip_safe=False,
)
