"""flashrt_ros.adopt layer (see ../shared/DESIGN.md §2)."""
