"""flashrt_ros: real-time vision-language-action policies for ROS 2.

Layers (dependencies point down only): ros -> engine -> policies -> adopt -> kernels.
The engine and policies never import rclpy.
"""

__version__ = "0.1.0"
