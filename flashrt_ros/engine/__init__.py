"""flashrt_ros.engine layer (see ../shared/DESIGN.md §2)."""
