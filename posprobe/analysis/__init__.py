"""Pure analysis: numpy arrays in, arrays or frozen dataclasses out. No torch, typer, rich or matplotlib."""
