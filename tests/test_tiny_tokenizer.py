"""The tiny models' tokenizer keeps each word's id, saved and loaded again (a tokenizer that maps every word to
[UNK] would leave the text-reading tests running on one repeated token)."""

from tiny_tokenizer import word_tokenizer


def test_words_keep_their_ids_through_save_and_load(tmp_path):
    from transformers import AutoTokenizer

    word_tokenizer().save_pretrained(tmp_path)
    encoded = AutoTokenizer.from_pretrained(tmp_path)(["w3 w59", "w0"], return_special_tokens_mask=True)
    assert encoded["input_ids"] == [[2, 8, 64, 3], [2, 5, 3]]
    assert encoded["special_tokens_mask"] == [[1, 0, 0, 1], [1, 0, 1]]
