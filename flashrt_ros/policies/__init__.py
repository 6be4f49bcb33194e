"""flashrt_ros.policies layer (see ../shared/DESIGN.md §2)."""
