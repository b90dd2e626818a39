"""File formats: atomic writes (`writing`), the TISA kernels file (`tisa_kernels`), profile files (`profiles`)."""
