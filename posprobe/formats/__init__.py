"""File formats: atomic writes (`writing`), the save path (`save`), TISA kernels (`tisa_kernels`), profile files."""
