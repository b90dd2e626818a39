"""Run a model on token batches once each and hand what it did to reducers: the one place that runs a model on text.

Every analysis over text is a reducer (`Reducer`): it says what it `needs` ("scores", "probs", "hidden_states"),
gets every batch once through `add(batch)` as a `BatchCapture`, keeps running sums, and returns its answer from
`result()`; memory is set by the reducers' sums and one batch, never by the corpus. Scores and probabilities are
recorded by posprobe's attention function where the family's attention goes through transformers'
AttentionInterface (`capture.recording`, checked against the model's own eager attention on the first batch), and
on the model's own eager path otherwise (`capture.eager`: its returned attentions and the inputs of its softmax,
checked on the first batch); hidden states are transformers' `output_hidden_states`. An encoder-decoder runs its
encoder stack on the text. The attention implementation, the recorder and the model's train/eval mode are restored
when the call ends, also on an error or Ctrl-C. Under torchrun (SPEC §19) each rank runs every world-th batch and
the reducers' sums are added over the ranks once at the end (`posprobe.runtime.distributed`).

Dimensions: B texts in the batch, m its longest sequence, L layers, H query heads, d hidden size.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from posprobe.capture.batches import TokenBatch
from posprobe.capture.eager import EagerRecorder, is_eager_route
from posprobe.capture.memory import attention_batch_bytes, check_fits
from posprobe.capture.model import (
    attention_layers,
    check_length,
    check_model,
    model_device,
    stack_to_run,
)
from posprobe.capture.recording import (
    RECORD_NAME,
    LayerRecorder,
    register_recording_attention,
    verify_against_eager,
)
from posprobe.errors import PosprobeError
from posprobe.runtime import distributed

if TYPE_CHECKING:
    import torch

WHAT = ("scores", "probs", "hidden_states")  # what a reducer may need


@dataclass(frozen=True)
class BatchCapture:
    """What one forward pass did on one batch (tensors on the model's device; None where no reducer asked).

    index: the batch's number (0-based, among all ranks' batches under torchrun); tokens: the `TokenBatch` (text
    ids, input ids, real / special / counted masks, positions); per attention layer a = 0..A-1 (every layer, A = L,
    except in a hybrid: layer `attention_layers[a]` of the model): scores[a] S and probs[a] A (B, H, m, m),
    S pre-softmax with the model's mask/bias added (masked pairs hold -inf or the dtype's minimum, A = 0 there);
    allowed[a] (B, m, m) bool, the pairs the model's mask lets query i see key j (padding, causality, windows);
    counted_pairs[a] = allowed[a] & counted_i & counted_j; hidden_states (L+1 entries, (B, m, d)): transformers'
    `output_hidden_states`, hidden_states[l] the input of layer l, [0] the embedding output, [L] the last output
    (every layer, a hybrid's included).
    """

    index: int
    tokens: TokenBatch
    scores: tuple[torch.Tensor, ...] | None = None
    probs: tuple[torch.Tensor, ...] | None = None
    allowed: tuple[torch.Tensor, ...] | None = None
    counted_pairs: tuple[torch.Tensor, ...] | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attention_layers: tuple[int, ...] = ()  # the model layer of each recorded entry (empty: none recorded)

    @property
    def text_ids(self) -> torch.Tensor:
        return self.tokens.text_ids

    @property
    def input_ids(self) -> torch.Tensor:
        return self.tokens.input_ids

    @property
    def real(self) -> torch.Tensor:
        return self.tokens.real

    @property
    def special(self) -> torch.Tensor:
        return self.tokens.special

    @property
    def counted(self) -> torch.Tensor:
        return self.tokens.counted

    @property
    def positions(self) -> torch.Tensor:
        return self.tokens.positions

    def __len__(self) -> int:
        return len(self.tokens)


class Reducer(Protocol):
    """An analysis over text: `needs` names what it reads (a subset of "scores", "probs", "hidden_states"),
    `add` takes each batch once, `result` returns the answer after the last batch."""

    needs: Collection[str]

    def add(self, batch: BatchCapture) -> None: ...

    def result(self) -> Any: ...


@dataclass(frozen=True)
class CaptureSummary:
    """What a capture ran: texts, batches, layers and heads of the model, the longest batch; `attention_layers`
    the layers whose attention was recorded (every layer but a hybrid's others; empty when none was)."""

    n_texts: int
    n_batches: int
    n_layers: int
    n_heads: int
    longest: int
    attention_layers: tuple[int, ...] = ()


def capture_batches(
    model,
    batches: Iterable[TokenBatch],
    reducers: Sequence[Reducer],
    *,
    verify: bool = True,
    progress: Callable[[int], None] | None = None,
) -> CaptureSummary:
    """Run `model` once per batch (inference mode, eval mode) and hand each `BatchCapture` to every reducer.

    Encoder-decoders run their encoder stack (`stack_to_run`). Batches must be on the model's device. `verify`:
    the first batch's recorded attention is checked against the model's own (only when scores or probabilities
    are recorded): through AttentionInterface, the batch is run again with eager attention and the outputs must
    agree; on the eager path, the recorded softmax inputs must give the returned attentions and the masks must be
    understood (`capture.eager`). `progress(k)` is called after each batch with the number of texts it held (under
    torchrun: after each of this rank's batches, with the texts of that round of batches over all ranks), and the
    summary counts every rank's texts.
    Raises PosprobeError for a model that cannot be captured, or when there is no batch."""
    import torch

    needs = set()
    for reducer in reducers:
        unknown = set(reducer.needs) - set(WHAT)
        if unknown:
            raise ValueError(f"{type(reducer).__name__} needs {sorted(unknown)}; a reducer may need {list(WHAT)}")
        needs |= set(reducer.needs)
    attention = bool(needs & {"scores", "probs"})
    hidden = "hidden_states" in needs
    n_layers, n_heads = check_model(model, attention=attention, encoder_decoder=True, hybrid=True)
    attending = tuple(attention_layers(model, n_layers)) if attention else ()  # a hybrid's attention layers only
    parallel = distributed.join_process_group(model_device(model))
    if parallel:
        distributed.check_mergeable(reducers)
    net = stack_to_run(model)
    eager = attention and is_eager_route(model)
    recorder = LayerRecorder("scores" in needs, "probs" in needs, len(attending))
    eager_recorder = EagerRecorder(len(attending), n_heads)
    previous = net.config._attn_implementation
    base = getattr(net, "base_model", net)
    sparse = getattr(base, "attention_type", None)  # BigBird switches itself to full attention on short inputs
    was_training = model.training
    n_texts = n_batches = longest = 0
    round_texts = 0  # texts of the current round of `world` batches, for a global progress count under torchrun
    try:
        model.eval()
        if attention and sparse == "block_sparse" and hasattr(base, "set_attention_type"):
            base.set_attention_type("original_full")  # what BigBird does itself on the lengths check_length allows
        if eager:
            eager_recorder.start(net)
        elif attention:
            register_recording_attention()
            net.set_attn_implementation(RECORD_NAME)
        with torch.inference_mode():
            for index, tokens in enumerate(batches):
                if parallel and not distributed.mine(index):  # another rank's batch (SPEC §19)
                    round_texts += len(tokens)
                    continue
                if progress is not None and round_texts:
                    progress(round_texts)  # the other ranks' batches of the last round, run beside this rank's
                round_texts = 0
                kwargs = {"output_hidden_states": True} if hidden else {}
                if attention:
                    check_length(net, int(tokens.input_ids.shape[1]))
                    _check_attention_fits(model, needs, len(attending), n_heads, tokens)
                if eager:
                    output, scores, probs, allowed = eager_recorder.forward(net, tokens, **kwargs)
                    if verify and n_batches == 0:
                        eager_recorder.verify(net, tokens, output, scores, probs, allowed)
                    recorded = (scores if "scores" in needs else None, probs if "probs" in needs else None, allowed)
                    del scores, probs
                elif attention:
                    recorder.begin(len(tokens), tokens.input_ids.shape[1])
                    with recorder:
                        output = net(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, **kwargs)
                    _check_calls(net, recorder.calls, len(attending))
                    if verify and n_batches == 0:
                        verify_against_eager(net, tokens.input_ids, tokens.attention_mask, output)
                    recorded = (
                        recorder.scores if recorder.keep_scores else None,
                        recorder.probs if recorder.keep_probs else None,
                        recorder.allowed,
                    )
                else:
                    output = net(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, **kwargs)
                    recorded = None
                batch = _batch_capture(index, tokens, recorded, output if hidden else None, attending)
                del output, recorded
                for reducer in reducers:
                    reducer.add(batch)
                n_texts += len(tokens)
                n_batches += 1
                longest = max(longest, int(tokens.input_ids.shape[1]))
                if progress is not None:
                    progress(len(tokens))
            if progress is not None and round_texts:
                progress(round_texts)
    finally:
        recorder.begin(0, 0)
        if eager:
            eager_recorder.stop(net)
        elif attention:
            net.set_attn_implementation(previous if previous != RECORD_NAME else "eager")
        if sparse is not None and getattr(base, "attention_type", sparse) != sparse:
            base.set_attention_type(sparse)
        model.train(was_training)
    if parallel:  # once, after the last batch: every rank then holds the sums of all texts
        n_texts, n_batches = distributed.reduce_counts([n_texts, n_batches])
        (longest,) = distributed.reduce_counts([longest], op="max")
        if n_texts:
            distributed.merge_reducers(reducers)
    if n_texts == 0:
        raise PosprobeError("no texts to measure", "pass at least one non-empty text")
    return CaptureSummary(n_texts, n_batches, n_layers, n_heads, longest, attending)


_CHECKED_FROM = 256 * 2**20  # smaller batches are not checked against the free memory


def _check_attention_fits(model, needs: set, n_layers: int, n_heads: int, tokens: TokenBatch) -> None:
    """Refuse in one line a batch whose recorded attention cannot fit in the free memory (`capture.memory`)."""
    batch, length = tokens.input_ids.shape
    element = next((p.element_size() for p in model.parameters()), 4)
    needed = attention_batch_bytes(n_layers, n_heads, batch, length, element, "scores" in needs, "probs" in needs)
    if needed >= _CHECKED_FROM:
        check_fits(
            needed,
            model_device(model),
            f"recording the attention of a batch of {batch} text(s) x {length} tokens ({n_layers} layers x "
            f"{n_heads} heads x {length}²)",
            "use a smaller --batch-size, or a smaller --max-length",
        )


def _batch_capture(
    index: int, tokens: TokenBatch, recorded: tuple | None, output, attending: tuple[int, ...] = ()
) -> BatchCapture:
    """recorded: (scores or None, probs or None, allowed) per attention layer (`attending`), or None when no
    attention was recorded.
    Every tensor is put beside the inputs (a no-op unless accelerate spread the layers over several devices)."""
    here = tokens.input_ids.device
    beside = lambda tensors: None if tensors is None else tuple(t.to(here) for t in tensors)  # noqa: E731
    hidden = None if output is None else beside(output.hidden_states)
    if recorded is None:
        return BatchCapture(index, tokens, hidden_states=hidden)
    scores, probs, allowed_per_layer = (beside(part) for part in recorded)
    counted = tokens.counted
    token_pairs = counted[:, :, None] & counted[:, None, :]
    pairs, seen = [], {}
    for allowed in allowed_per_layer:  # layers with the same mask share one tensor
        if id(allowed) not in seen:
            seen[id(allowed)] = token_pairs & allowed
        pairs.append(seen[id(allowed)])
    return BatchCapture(
        index,
        tokens,
        scores=scores,
        probs=probs,
        allowed=allowed_per_layer,
        counted_pairs=tuple(pairs),
        hidden_states=hidden,
        attention_layers=attending,
    )


def _check_calls(model, calls: int, layers: int) -> None:
    if calls == layers:
        return
    kind = getattr(model.config, "model_type", "unknown")
    if calls == 0:
        raise PosprobeError(
            f"'{kind}' did not call the registered attention function, so its attention cannot be recorded",
            "use a family whose attention goes through transformers' AttentionInterface",
        )
    raise PosprobeError(
        f"'{kind}' made {calls} attention calls for {layers} attention layers", "this model's layout is not supported"
    )
