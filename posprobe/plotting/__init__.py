"""Figures drawn from results (matplotlib Figures, or a Mosaic of matrix panels); `base` has what all share."""
