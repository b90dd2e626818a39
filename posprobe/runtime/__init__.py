"""How a run is carried out: ranks under torchrun (`distributed`) and the named phases of long work (`phases`)."""
