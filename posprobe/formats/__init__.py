"""File formats: atomic writes (`writing`), the one save path of every result (`save`), the TISA kernels file (`tisa_kernels`), profile files (`profiles`)."""
