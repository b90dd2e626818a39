#!/bin/sh
# Regenerate the figures of the README and docs/ (run from the repository root with the project's virtualenv active).
# These are the only commands that write into figures/; default runs write into the git-ignored posprobe-out/.
# GLUE: the folder holding the GLUE tasks as .jsonl (default ../shared/data/glue, beside the repository).
# Not here: figures/learned/ and figures/states/minilm-cola-series/ need a fine-tune first (figures/README.md).
set -e
GLUE=${GLUE:-../shared/data/glue}
COLA=$GLUE/cola/validation.jsonl
SMOL=SmolLM2-135M-Instruct

# all-MiniLM-L6-v2, the packaged default: from its weights
posprobe toeplitz --out figures/toeplitz/all-MiniLM-L6-v2
posprobe fhat --out figures/fhat/all-MiniLM-L6-v2  # the default: each head its own colour scale (the title says so)
posprobe profiles --layers 0 --out figures/profiles/all-MiniLM-L6-v2
posprobe fit-tisa --out figures/fit-tisa/all-MiniLM-L6-v2
# ... and on text (figures/attention/README.md, figures/states/README.md)
posprobe attention --text "$COLA" --column sentence --out figures/attention/all-MiniLM-L6-v2-cola
posprobe attention --text "$GLUE/sst2/validation.jsonl" --column sentence \
    --out figures/attention/all-MiniLM-L6-v2-sst2
posprobe states --text "$COLA" --column sentence --out figures/states/all-MiniLM-L6-v2-cola

# SmolLM2-135M-Instruct, the packaged rotary causal LLM (Q4_1 GGUF): the README's "A real rotary LLM"
posprobe profiles $SMOL --layers 0,15,29 --out figures/profiles/$SMOL
posprobe fit-tisa $SMOL --layers 0,15,29 --out figures/fit-tisa/$SMOL
posprobe compare all-MiniLM-L6-v2 $SMOL --out figures/compare/all-MiniLM-L6-v2-vs-$SMOL  # the docs' compare page
posprobe profiles $SMOL --layers 0,15,29 --text "$COLA" --column sentence --max-texts 200 \
    --out figures/profiles/$SMOL-cola
posprobe attention $SMOL --text "$COLA" --column sentence --max-texts 200 --out figures/attention/$SMOL-cola
posprobe rotary $SMOL --layers 0,4,8,12,16,20,24,29 --text "$COLA" --column sentence --max-texts 200 \
    --out figures/rotary/$SMOL-cola
posprobe states $SMOL --text "$COLA" --column sentence --out figures/states/$SMOL-cola

# `posprobe report` (the README's Quick start): the page's top as headless Chromium draws it; the page itself and
# its section folders go to a temporary folder (only the screenshot is kept)
REPORT=$(mktemp -d)
posprobe report --out "$REPORT"
mkdir -p figures/report
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1000,1500 \
    --screenshot=figures/report/report-all-MiniLM-L6-v2.png "file://$REPORT/report.html"
rm -rf "$REPORT"

# SmolLM2 across the context (README "Across the context"): loss by position and perplexity per length on the
# King James Bible (builtin:kjv, the default text), three lengths within the trained 8,192, four rotary variants
posprobe context $SMOL --lengths 512,1024,2048 --windows 2 --rope-scaling none,linear:2,yarn:4,llama3:8 \
    --out figures/context/$SMOL

# The newest position designs (README "New position designs"): tiny RANDOM models built in code (no real checkpoint
# offline; figures/tiny_designs.py), labelled tiny-random in every title
TINY=posprobe-out/tiny-random
python figures/tiny_designs.py $TINY
posprobe profiles $TINY/tiny-random-smollm3 --layers 2,3 --positions 64 --out figures/designs/tiny-random-smollm3
posprobe profiles $TINY/tiny-random-deepseek_v3 --layers 0 --positions 64 --out figures/designs/tiny-random-deepseek_v3
posprobe profiles $TINY/tiny-random-lfm2 --layers 0,1 --positions 64 --out figures/designs/tiny-random-lfm2
# ... and on text (builtin:sentences, byte tokens); figures/designs/ keeps the figures figures/README.md lists
posprobe attention $TINY/tiny-random-lfm2 --max-length 48 --out posprobe-out/designs/tiny-random-lfm2-attention
posprobe attention $TINY/tiny-random-gpt_oss --max-length 48 --out posprobe-out/designs/tiny-random-gpt_oss-attention
mkdir -p figures/designs/tiny-random-lfm2-attention figures/designs/tiny-random-gpt_oss-attention
cp posprobe-out/designs/tiny-random-lfm2-attention/mean_distance.png \
    posprobe-out/designs/tiny-random-lfm2-attention/attention_profiles_layer1.png figures/designs/tiny-random-lfm2-attention/
cp posprobe-out/designs/tiny-random-gpt_oss-attention/learned_sinks.png \
    posprobe-out/designs/tiny-random-gpt_oss-attention/attention_profiles_layer0.png \
    figures/designs/tiny-random-gpt_oss-attention/

# SmolLM2: retrieval by length and depth (the README's "Retrieval by length and depth" section)
posprobe needle $SMOL --lengths 256,512,1024 --trials 3 --out figures/needle/$SMOL
