"""Texts to run a model on: files, columns and builtin texts (`reading`), hub dataset splits (`hub`)."""
