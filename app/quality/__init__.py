"""Quality: inter-annotator agreement, its flags and rows, step agreement, rollups and the charts that show them."""
