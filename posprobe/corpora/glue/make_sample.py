"""Writes the GLUE-format sample next to this file (`cola/`, `sst2/`: `train.jsonl`, `validation.jsonl` in the
Hugging Face glue schema), so that `finetune`, `evaluate` and `kernels` examples run from a clone with
`--data-dir posprobe/corpora/glue`. Every sentence is made here from word lists written for posprobe (no GLUE
text); the same seed gives the same files. Run: `python posprobe/corpora/glue/make_sample.py`.

CoLA-style (label 1 = acceptable): subject-verb-object sentences, and unacceptable variants of them (verb
agreement broken, words out of order, a doubled determiner, a missing object of a transitive verb). SST-2-style
(label 1 = positive): short film reviews built from positive or negative phrases, some with negation.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

SEED = 0
N_TRAIN, N_VALIDATION = 240, 80

NOUNS = ["teacher", "farmer", "child", "sailor", "painter", "doctor", "baker", "student", "pilot", "writer"]
OBJECTS = ["letter", "garden", "bridge", "song", "window", "map", "cake", "boat", "picture", "fence"]
ADJECTIVES = ["old", "young", "quiet", "tall", "busy", "careful", "tired", "cheerful"]
VERBS = [("builds", "build", "built"), ("paints", "paint", "painted"), ("finds", "find", "found"),
         ("carries", "carry", "carried"), ("cleans", "clean", "cleaned"), ("sells", "sell", "sold")]  # fmt: skip
PLACES = ["near the river", "in the morning", "after lunch", "at the market", "with great care", "before winter"]

GOOD = ["moving", "funny", "beautiful", "clever", "warm", "gripping", "charming", "honest", "tender", "bright"]
BAD = ["dull", "tedious", "clumsy", "shallow", "lifeless", "confused", "bland", "tiresome", "cheap", "hollow"]
THINGS = ["story", "script", "cast", "score", "ending", "direction", "dialogue", "camera work"]
FILMS = ["film", "movie", "picture", "drama", "comedy"]


def cola_example(rng: random.Random) -> dict:
    noun, thing, adjective, place = rng.choice(NOUNS), rng.choice(OBJECTS), rng.choice(ADJECTIVES), rng.choice(PLACES)
    present, plural, past = rng.choice(VERBS)
    words = f"the {adjective} {noun} {rng.choice([present, past])} the {thing} {place}".split()
    if rng.random() < 2 / 3:
        return {"sentence": " ".join(words), "label": 1}
    kind = rng.randrange(4)
    if kind == 0:  # a plural subject with a singular verb
        words = f"the {adjective} {noun}s {present} the {thing} {place}".split()
    elif kind == 1:  # the verb moved to the end
        verb = words.pop(3)
        words.append(verb)
    elif kind == 2:  # a doubled determiner
        words.insert(4, "the")
    else:  # the transitive verb without its object
        words = f"the {adjective} {noun} {plural}s {place}".split() if rng.random() < 0.5 else words[:4]
    return {"sentence": " ".join(words), "label": 0}


def with_article(word: str) -> str:
    return ("an " if word[0] in "aeiouh" and word != "hollow" else "a ") + word


def sst2_example(rng: random.Random) -> dict:
    positive = rng.random() < 0.5
    negated = rng.random() < 0.25
    own, other = (GOOD, BAD) if positive != negated else (BAD, GOOD)
    film, thing = rng.choice(FILMS), rng.choice(THINGS)
    if negated:
        sentence = f"the {thing} is never {rng.choice(own)} , and the {film} is not {rng.choice(other)} at all"
    else:
        sentence = rng.choice(
            [
                f"{with_article(rng.choice(own))} and {rng.choice(own)} {film}",
                f"the {thing} is {rng.choice(own)} from start to finish",
                f"{rng.choice(own)} {thing} , {rng.choice(own)} {film}",
                f"this {film} is {rng.choice(own)} , with {with_article(rng.choice(own))} {thing}",
            ]
        )
    return {"sentence": sentence, "label": int(positive)}


def write(folder: Path, make, rng: random.Random) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", N_TRAIN), ("validation", N_VALIDATION)):
        rows = [make(rng) | {"idx": i} for i in range(n)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


if __name__ == "__main__":
    here = Path(__file__).parent
    write(here / "cola", cola_example, random.Random(SEED))
    write(here / "sst2", sst2_example, random.Random(SEED + 1))
