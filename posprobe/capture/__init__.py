"""Running a model on text: once per batch, what it did goes to reducers.

The capture layer hands each batch's attention scores and probabilities, hidden states and token masks to
reducers. Every analysis over text (`posprobe attention`'s profiles and sinks, ...)
is a reducer; none wires the model itself.

- `batches.py`: texts or token ids -> padded `TokenBatch`es (length-sorted chunks, right padding, masks);
- `recording.py`: the recorders, taps on the attention kernel (`posprobe.kernel`, transformers' AttentionInterface)
  that keep each layer's scores and probabilities; its blockwise route for long texts (blocks of query rows, handed
  to reducers with `add_block` as `BlockCapture`s, memory linear in the length; SPEC §19);
- `eager.py`: the route for families outside AttentionInterface (T5, BLOOM, MPT, Falcon, DeBERTa, MPNet, BART's
  encoder, ...): their own eager attention with `output_attentions`, the softmax inputs observed on the way, and
  its first-batch checks;
- `chunks.py`: the eager route of neighbour-chunk layers (Reformer's local layers), whose per-chunk attention is
  rebuilt as (queries x keys) matrices;
- `model.py`: loading, the checks a capturable model passes, the stack that runs (an encoder-decoder's encoder),
  device / max length / pad id;
- `loop.py`: the one run loop, `drive(net, items, reducers, make_route, taps=, edits=)`: one forward pass per item,
  taps and edits applied (an `=mean` edit's first pass included), the items shared out over torchrun ranks and the
  reducers merged once; what a pass is belongs to its route. `run(model, steps, reducers, taps, edits=)` drives
  `Step`s (`posprobe context`'s windows, `posprobe needle`'s prompts: reducers of per-token loss, logits or
  attention rows) on a `StepRoute`;
- `run.py`: `capture_batches` (text batches driven on a `BatchRoute`), `BatchCapture` (what one batch did) and the
  `Reducer` protocol;
- `textrun.py`: one run over texts: its checked description (`TextRun`, built by `text_run`), `run_texts` (read the
  model, check it, resolve the max length and device, capture with a list of reducers) and `capture`.
- `retrieval.py`: the attention one query row gives a span of keys, per layer and head, read during an ordinary
  forward pass without keeping any (queries x keys) matrix (`posprobe needle`'s retrieval attention).

Taps on the attention kernel (`posprobe.kernel.Taps`) reach every run: `capture_batches(..., taps=)`,
`run_texts(..., taps=)`, `loop.run(..., taps)`; so do the user's edits (SPEC §20, `posprobe.edits`), as `edits=`.

A reducer::

    class MeanHidden:
        needs = ("hidden_states",)

        def __init__(self):
            self.sum, self.count = 0.0, 0

        def add(self, batch):  # a BatchCapture
            h = batch.hidden_states[3][batch.counted]  # (tokens, d): layer 3's input on counted tokens
            self.sum, self.count = self.sum + h.double().sum(0), self.count + h.shape[0]

        def result(self):
            return (self.sum / self.count).cpu().numpy()

    capture(model, [reducer], texts, tokenizer=tokenizer, max_length=128)
"""

from posprobe.capture.batches import TokenBatch, id_tokenizer, pad_batch, text_tokenizer, token_batches
from posprobe.capture.eager import is_eager_route
from posprobe.capture.model import (
    check_model,
    load_for_capture,
    max_positions,
    pad_token_id,
    place_on,
    resolve_device,
    resolve_max_length,
    stack_to_run,
)
from posprobe.capture.recording import RECORD_NAME, register_recording_attention
from posprobe.capture.run import BatchCapture, BlockCapture, CaptureSummary, Reducer, capture_batches
from posprobe.capture.textrun import TextModel, TextRun, capture, run_texts, text_run

__all__ = [
    "RECORD_NAME",
    "BatchCapture",
    "BlockCapture",
    "CaptureSummary",
    "Reducer",
    "TextModel",
    "TextRun",
    "TokenBatch",
    "capture",
    "capture_batches",
    "check_model",
    "id_tokenizer",
    "is_eager_route",
    "load_for_capture",
    "max_positions",
    "pad_batch",
    "pad_token_id",
    "place_on",
    "register_recording_attention",
    "resolve_device",
    "resolve_max_length",
    "run_texts",
    "stack_to_run",
    "text_run",
    "text_tokenizer",
    "token_batches",
]

from posprobe.runtime.submodules import importer

__getattr__ = importer(__name__)  # submodules on first use, as in a notebook
