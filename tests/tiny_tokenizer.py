"""A WordPiece tokenizer for the tiny test models, built in memory (no hub): ids 0-4 are [PAD] [UNK] [CLS] [SEP]
[MASK], then the words w0, w1, ... (so "w3" is id 8).

transformers 5's `BertTokenizerFast(vocab_file=...)` ignores the file and maps every word to [UNK]; the vocabulary
is passed as a dict instead (`tests/test_tiny_tokenizer.py` checks that words keep their ids).
"""

from __future__ import annotations

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def word_tokenizer(n_words: int = 60):
    """A BertTokenizerFast over the specials and w0..w{n_words-1} (ids 0..n_words+4)."""
    from transformers import BertTokenizerFast

    words = SPECIALS + [f"w{i}" for i in range(n_words)]
    return BertTokenizerFast(vocab={w: i for i, w in enumerate(words)})


def causal_folder(path, model):
    """`path` holding `model` (a tiny causal LM) and a word tokenizer whose [CLS] is its BOS and [SEP] its EOS."""
    tokenizer = word_tokenizer(60)
    tokenizer.bos_token, tokenizer.eos_token = "[CLS]", "[SEP]"
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return path
