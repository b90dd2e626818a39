"""Retrofitting: install a mechanism (`install`), run its attention (`attention`), load any model (`loading`)."""
