#!/bin/sh
# Regenerate the README's figures (run from the repository root with the project's virtualenv active).
# These are the only commands that write into figures/; default runs write into the git-ignored posprobe-out/.
set -e
posprobe toeplitz --out figures/toeplitz/all-MiniLM-L6-v2
posprobe fhat --out figures/fhat/all-MiniLM-L6-v2
posprobe profiles --layers 0 --out figures/profiles/all-MiniLM-L6-v2
posprobe fit-tisa --out figures/fit-tisa/all-MiniLM-L6-v2
