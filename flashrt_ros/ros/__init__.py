"""ROS layer: thin rclpy node, message conversions, services, parameters."""
