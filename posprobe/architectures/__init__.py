"""What each model type is, from its config alone: the family table (`table`), config fields and sizes (`config`)."""
