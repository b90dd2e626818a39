"""Texts to padded token batches: tokenise a chunk at a time, sort by length within the chunk, right-pad, and mark
which tokens are real, special and counted.

Dimensions: B texts in a batch, m the batch's longest sequence (m <= max_length). Right padding only, so the real
tokens of a text sit at positions 0..len-1 and the first token of every text is at position 0.
Memory never depends on the corpus: at most `chunk` texts are held at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from posprobe.errors import PosprobeError

if TYPE_CHECKING:
    import torch

# one tokenised text: (its index in the input order, token ids, special-token flags 0/1)
Encoded = tuple[int, list[int], list[int]]
CHUNK_BATCHES = 16  # texts are read and tokenised this many batches at a time


@dataclass(frozen=True)
class TokenBatch:
    """One padded batch, on the model's device.

    text_ids (B,) long: each row's index among the texts as they were given (rows are sorted by length);
    input_ids (B, m) long; attention_mask (B, m) long, 1 = real token, 0 = padding;
    special (B, m) bool: special tokens ([CLS], [SEP], BOS, ... as the tokenizer marks them, or `special_ids`);
    counted (B, m) bool: the tokens analyses count: real, and not special when special tokens are excluded.
    """

    text_ids: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    special: torch.Tensor
    counted: torch.Tensor

    @property
    def real(self) -> torch.Tensor:
        """(B, m) bool: not padding."""
        return self.attention_mask.bool()

    @property
    def positions(self) -> torch.Tensor:
        """(B, m) long: each real token's position (0-based; right padding), -1 on padding."""
        import torch

        m = self.input_ids.shape[1]
        at = torch.arange(m, device=self.input_ids.device).expand_as(self.input_ids)
        return torch.where(self.real, at, -1)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def text_tokenizer(
    tokenizer: Any, max_length: int, vocab_size: int | None = None
) -> Callable[[list[str]], list[tuple[list[int], list[int]]]]:
    """Tokenise strings with the model's tokenizer (special tokens added as it does), truncated to `max_length`;
    returns (ids, special flags) per text. Refused: a text that gives no token, or only special tokens (nothing of
    it reaches the model), and ids at or beyond `vocab_size` (the model's embedding rows: a tokenizer of another
    model)."""

    def tokenize(texts: list[str]) -> list[tuple[list[int], list[int]]]:
        enc = tokenizer(texts, truncation=True, max_length=max_length, return_special_tokens_mask=True)
        out = list(zip(enc["input_ids"], enc["special_tokens_mask"]))
        for text, (ids, mask) in zip(texts, out):
            _check_tokens(text, ids, mask, tokenizer, vocab_size)
        return out

    return tokenize


def _check_tokens(text: str, ids: list[int], mask: list[int], tokenizer: Any, vocab_size: int | None) -> None:
    if not ids:
        raise PosprobeError(f"the tokenizer turned the text {text[:40]!r} into no tokens", "remove empty texts")
    if all(mask):
        tokens = " ".join(str(t) for t in tokenizer.convert_ids_to_tokens(ids))
        raise PosprobeError(
            f"the tokenizer turned the text {text[:40]!r} into special tokens only ({tokens[:60]})",
            "remove texts without words the tokenizer keeps (control or zero-width characters only)",
        )
    _check_ids(ids, vocab_size, f"for the text {text[:40]!r}")


def _check_ids(ids: Sequence[int], vocab_size: int | None, where: str) -> None:
    if vocab_size is None:
        return
    bad = next((x for x in ids if not 0 <= x < vocab_size), None)
    if bad is not None:
        raise PosprobeError(
            f"token id {bad} {where} is outside the model's {vocab_size} token embeddings",
            "use the tokenizer saved with the model (its tokenizer files belong to another model)",
        )


def id_tokenizer(special_ids: Iterable[int], max_length: int, vocab_size: int | None = None) -> Callable:
    """Pre-tokenised sequences (lists of ints), truncated to `max_length`; ids in `special_ids` are special; ids
    outside 0..`vocab_size`-1 are refused."""
    specials = {int(x) for x in special_ids}

    def tokenize(rows: list[Sequence[int]]) -> list[tuple[list[int], list[int]]]:
        out = []
        for row in rows:
            ids = [int(x) for x in row][:max_length]
            if not ids:
                raise PosprobeError("an input_ids sequence is empty", "pass sequences of at least one token")
            _check_ids(ids, vocab_size, "in input_ids")
            out.append((ids, [int(x in specials) for x in ids]))
        return out

    return tokenize


def encoded_batches(items: Iterable, tokenize: Callable, batch_size: int, chunk: int) -> Iterator[list[Encoded]]:
    """Lists of at most `batch_size` tokenised items; items are read and tokenised `chunk` at a time and sorted by
    length (longest first) within the chunk (less padding), so memory never depends on the corpus size."""
    buffer: list = []
    first = 0

    def flush(start: int):
        encoded = [(start + i, ids, special) for i, (ids, special) in enumerate(tokenize(buffer))]
        encoded.sort(key=lambda e: len(e[1]), reverse=True)
        for at in range(0, len(encoded), batch_size):
            yield encoded[at : at + batch_size]

    for item in items:
        buffer.append(item)
        if len(buffer) >= chunk:
            yield from flush(first)
            first += len(buffer)
            buffer = []
    if buffer:
        yield from flush(first)


def pad_batch(batch: list[Encoded], pad_id: int, exclude_special: bool, device: Any = "cpu") -> TokenBatch:
    """Right-pad tokenised items into a `TokenBatch` on `device` (padding filled with `pad_id`)."""
    import torch

    m = max(len(ids) for _, ids, _ in batch)
    ids = torch.full((len(batch), m), pad_id, dtype=torch.long)
    real = torch.zeros((len(batch), m), dtype=torch.bool)
    special = torch.zeros((len(batch), m), dtype=torch.bool)
    for b, (_, row, flags) in enumerate(batch):
        ids[b, : len(row)] = torch.tensor(row, dtype=torch.long)
        real[b, : len(row)] = True
        special[b, : len(row)] = torch.tensor(flags, dtype=torch.bool)
    counted = real & ~special if exclude_special else real
    text_ids = torch.tensor([t for t, _, _ in batch], dtype=torch.long)
    return TokenBatch(
        text_ids.to(device), ids.to(device), real.long().to(device), special.to(device), counted.to(device)
    )


def token_batches(
    items: Iterable,
    tokenize: Callable,
    *,
    batch_size: int,
    pad_id: int,
    exclude_special: bool = False,
    max_texts: int | None = None,
    device: Any = "cpu",
) -> Iterator[TokenBatch]:
    """`TokenBatch`es of texts or id sequences (`tokenize` from `text_tokenizer` / `id_tokenizer`), at most
    `max_texts` of them, in length-sorted chunks of `CHUNK_BATCHES` batches."""
    if max_texts is not None:
        items = _take(items, max_texts)
    for batch in encoded_batches(items, tokenize, batch_size, chunk=batch_size * CHUNK_BATCHES):
        yield pad_batch(batch, pad_id, exclude_special, device)


def _take(items: Iterable, count: int) -> Iterator:
    for index, item in enumerate(items):
        if index >= count:
            return
        yield item
