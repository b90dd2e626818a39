"""Run a model on token batches once each and hand what it did to reducers: the route of text batches on the one
run loop (`capture.loop.drive`, which also runs `context`'s windows and `needle`'s prompts).

Every analysis over text is a reducer (`Reducer`): it says what it `needs` ("scores", "probs", "hidden_states"),
gets every batch once through `add(batch)` as a `BatchCapture`, keeps running sums, and returns its answer from
`result()`; memory is set by the reducers' sums and one batch, never by the corpus. Scores and probabilities are
recorded by posprobe's attention function where the family's attention goes through transformers'
AttentionInterface (`capture.recording`, checked against the model's own eager attention on the first batch), and
on the model's own eager path otherwise (`capture.eager`: its returned attentions and the inputs of its softmax,
checked on the first batch; `capture.chunks`: neighbour-chunk layers' per-chunk attention rebuilt; `capture.stacks`
where stacks run one after another, BLT: its byte layers' own modules); hidden states are transformers'
`output_hidden_states`. An encoder-decoder runs its encoder stack on the text. The attention implementation, the
recorder and the model's train/eval mode are restored when the call ends, also on an error or Ctrl-C (`BatchRoute`).
Under torchrun (SPEC §19) each rank runs every world-th batch and the reducers' sums are added over the ranks once at
the end (the loop's, `posprobe.runtime.distributed`).

Dimensions: B texts in the batch, m its longest sequence, L layers, H query heads, d hidden size.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from posprobe.capture.batches import TokenBatch
from posprobe.capture.eager import is_eager_route
from posprobe.capture.memory import attention_batch_bytes, attention_block_bytes, check_fits
from posprobe.capture.model import (
    attention_layers,
    check_hidden_states,
    check_length,
    check_model,
    model_device,
    reads_padding,
    stack_to_run,
)
from posprobe.capture.recording import BLOCK_NAME, RECORD_NAME, BlockRecorder, LayerRecorder
from posprobe.capture.stacks import eager_route_recorder
from posprobe.errors import PosprobeError
from posprobe.kernel import Taps, register, verify_against_eager
from posprobe.runtime import distributed
from posprobe.validation import as_int

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
    allowed[a] (B, m, m) bool, the pairs the model's mask lets query i see key j (padding, causality, windows),
    (B, H, m, m) in a layer whose heads pick keys of their own (MiniMax M3's block indexer per key-head group);
    counted_pairs[a] = allowed[a] & counted_i & counted_j (with the same head axis where allowed[a] has one);
    hidden_states (L+1 entries, (B, m, d)): transformers' `output_hidden_states`, hidden_states[l] the input of
    layer l, [0] the embedding output, [L] the last output (every layer, a hybrid's included).
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


@dataclass(frozen=True)
class BlockCapture:
    """One block of query rows of one layer of one batch, on the blockwise route (SPEC §19): rows start..start+b-1
    against every key. index and tokens as in `BatchCapture`; scores S and probs A (B, H, b, m), allowed and
    counted_pairs (B, b, m) bool ((B, H, b, m) where the layer's heads pick keys of their own), the rows
    start..start+b-1 of `BatchCapture`'s tensors of that layer."""

    index: int
    tokens: TokenBatch
    layer: int
    start: int
    scores: torch.Tensor
    probs: torch.Tensor
    allowed: torch.Tensor
    counted_pairs: torch.Tensor


class Reducer(Protocol):
    """An analysis over text: `needs` names what it reads (a subset of "scores", "probs", "hidden_states"),
    `add` takes each batch once, `result` returns the answer after the last batch. A reducer of attention that also
    has `add_block(block)` (a `BlockCapture`) may be handed blocks of query rows instead of whole batches: every
    block of every layer of a batch once, and then no `add` for that batch."""

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
    block_size: int | None = None,
    taps: Taps | None = None,
    edits: Sequence = (),
) -> CaptureSummary:
    """Run `model` once per batch (inference mode, eval mode) and hand each `BatchCapture` to every reducer: the run
    loop (`capture.loop.drive`) on a `BatchRoute`.

    Encoder-decoders run their encoder stack, or their decoder where the family's encoder reads no text
    (`Family.text_stack`: Whisper; `stack_to_run`). Batches must be on the model's device. `verify`:
    the first batch's recorded attention is checked against the model's own (only when scores or probabilities
    are recorded): through AttentionInterface, the batch is run again with eager attention and the outputs must
    agree; on the eager path, the recorded softmax inputs must give the returned attentions and the masks must be
    understood (`capture.eager`). `progress(k)` is called after each batch with the number of texts it held (under
    torchrun: after each of this rank's batches, with the texts of that round of batches over all ranks), and the
    summary counts every rank's texts.
    Blockwise route (SPEC §19): where the family's attention goes through AttentionInterface and every reducer of
    attention has `add_block`, a batch is run on the kernel's blockwise route (`kernel.BLOCKS`) and its reducers
    get blocks of `block_size` query rows (`BlockCapture`) instead of whole matrices: `block_size` None (the
    default) does this for the batches whose whole matrices would take at least 256 MiB (blocks of about
    `kernel.routes.BLOCK_ELEMENTS` scores), 0 never, a positive number for every batch. The first batch run in
    blocks is checked too, on its first 256 tokens, in blocks of a quarter of them.
    `taps`: taps on the attention kernel (`posprobe.kernel.Taps`) applied in every forward pass, before the
    recorders read the attention (a run with no attention reducer runs on the kernel's eager route then, whose
    outputs are the eager path's); refused for a family outside AttentionInterface. The first-batch check compares
    the kernel without the taps with the model's eager attention. `edits`: parsed edits (SPEC §20, `posprobe.edits`,
    checked by the caller against the config): their taps first, their hooks installed for the run; where one asks
    for a mean, this rank's batches are run once before, without edits, for it (over real tokens).
    Raises PosprobeError for a model that cannot be captured, or when there is no batch."""
    from posprobe.capture.loop import drive, needs_of

    needs = needs_of(reducers, WHAT)
    if block_size is not None:
        block_size = as_int(block_size, "block_size", minimum=0)
    attention = bool(needs & {"scores", "probs"})
    n_layers, n_heads = check_model(model, attention=attention, encoder_decoder=True, hybrid=True)
    if "hidden_states" in needs:
        check_hidden_states(model)  # a model that skips layers on text has no hidden state entering them
    attending = tuple(attention_layers(model, n_layers)) if attention else ()  # a hybrid's attention layers only
    tally = Tally()

    def make_route(taps: Taps | None, collect=None) -> BatchRoute:
        if collect is not None:  # an `=mean` edit's first pass: plain forward passes over the real tokens
            return BatchRoute(model, (), set(), n_heads, (), Tally(), taps, collect=collect)
        return BatchRoute(model, reducers, needs, n_heads, attending, tally, taps, verify=verify, progress=progress,
                          block_size=block_size)  # fmt: skip

    drive(stack_to_run(model), batches, reducers, make_route, taps=taps, edits=edits)
    if tally.n_texts == 0:
        raise PosprobeError("no texts to measure", "pass at least one non-empty text")
    return CaptureSummary(tally.n_texts, tally.n_batches, n_layers, n_heads, tally.longest, attending)


@dataclass
class Tally:
    """What a capture ran so far: texts, batches, the longest batch; `round_texts` the texts of the current round
    of `world` batches run by the other ranks (for a progress count over every rank's texts under torchrun)."""

    n_texts: int = 0
    n_batches: int = 0
    longest: int = 0
    round_texts: int = 0


class BatchRoute:
    """The route of padded text batches (`TokenBatch`es; see `capture_batches`): on entry the model in eval mode,
    attention recorded through the kernel (whole matrices, or blocks where `block_size` says) or on the family's
    eager path where it is outside AttentionInterface, BigBird on full attention; on exit every setting restored.
    `step` runs one batch and hands its `BatchCapture` (or its blocks) to the reducers, counting it in `tally`.
    With `collect` (an `edits.apply.MeanPass`): the plain passes of an `=mean` edit's first pass, over real tokens."""

    def __init__(
        self,
        model,
        reducers: Sequence[Reducer],
        needs: set[str],
        n_heads: int,
        attending: tuple[int, ...],
        tally: Tally,
        taps: Taps | None,
        *,
        verify: bool = True,
        progress: Callable[[int], None] | None = None,
        block_size: int | None = None,
        collect: Any = None,
    ):
        from posprobe.capture.loop import refuse_taps

        refuse_taps(model, taps)
        self.model, self.net, self.reducers, self.needs = model, stack_to_run(model), reducers, needs
        self.n_heads, self.attending, self.tally, self.taps = n_heads, attending, tally, taps
        self.verify, self.progress, self.block_size, self.collect = verify, progress, block_size, collect
        self.attention = bool(needs & {"scores", "probs"})
        self.hidden = "hidden_states" in needs
        self.unpadded = reads_padding(model)  # ConvBERT, CPM-Ant: padding changes their real tokens' outputs
        self.kernel = self.attention or taps is not None  # the run goes through the attention kernel
        self.eager = self.attention and is_eager_route(model)
        self.recorder = LayerRecorder("scores" in needs, "probs" in needs, len(attending), n_heads)
        self.eager_recorder = eager_route_recorder(self.net, list(attending), n_heads) if self.eager else None
        self.blockwise = (
            self.attention
            and not self.eager
            and block_size != 0
            and all(
                hasattr(r, "add_block") and not (set(r.needs) - {"scores", "probs"})
                for r in reducers
                if set(r.needs) & {"scores", "probs"}
            )
        )
        self.block_readers = [r for r in reducers if set(r.needs) & {"scores", "probs"}] if self.blockwise else []
        self.previous = self.net.config._attn_implementation
        self.base = getattr(self.net, "base_model", self.net)
        self.sparse = getattr(self.base, "attention_type", None)  # BigBird: full attention on short inputs
        self.checked: set[str] = set()  # the routes whose first batch was checked against eager attention

    def __enter__(self) -> BatchRoute:
        self.was_training = self.model.training
        try:
            self.model.eval()
            if self.attention and self.sparse == "block_sparse" and hasattr(self.base, "set_attention_type"):
                self.base.set_attention_type("original_full")  # what BigBird does itself on the lengths allowed
            if self.eager:
                self.eager_recorder.start(self.net)
            elif self.kernel:
                register()
                self.net.set_attn_implementation(RECORD_NAME)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        net = self.net
        self.recorder.begin(0, 0)
        if self.eager:
            self.eager_recorder.stop(net)
        elif self.kernel:
            net.set_attn_implementation(self.previous if self.previous != RECORD_NAME else "eager")
        if self.sparse is not None and getattr(self.base, "attention_type", self.sparse) != self.sparse:
            self.base.set_attention_type(self.sparse)
        self.model.train(self.was_training)

    def other(self, index: int, tokens: TokenBatch) -> None:
        self.tally.round_texts += len(tokens)

    def finish(self, parallel: bool) -> bool:
        tally = self.tally
        if self.progress is not None and tally.round_texts:
            self.progress(tally.round_texts)
        if parallel:  # every rank's texts and batches
            tally.n_texts, tally.n_batches = distributed.reduce_counts([tally.n_texts, tally.n_batches])
            (tally.longest,) = distributed.reduce_counts([tally.longest], op="max")
        return tally.n_texts > 0

    def step(self, index: int, tokens: TokenBatch) -> None:
        net, tally = self.net, self.tally
        if self.collect is not None:  # the means pass: sums over the real tokens
            self.collect.real = tokens.attention_mask.bool()
            _forward(net, tokens, {}, self.taps)
            return
        if self.progress is not None and tally.round_texts:
            self.progress(tally.round_texts)  # the other ranks' batches of the last round, run beside this rank's
        tally.round_texts = 0
        if self.unpadded and not bool(tokens.real.all()):
            raise PosprobeError(
                f"'{net.config.model_type}' gives real tokens outputs that depend on the padding beside them, "
                "so a padded batch is not its texts alone",
                "run its texts one at a time (batches of one text)",
            )
        output, recorded, in_blocks = self._run(index, tokens)
        if self.hidden:
            _check_hidden(net, output.hidden_states, int(tokens.input_ids.shape[1]))
        batch = _batch_capture(index, tokens, recorded, output if self.hidden else None, self.attending)
        del output, recorded
        for reducer in self.reducers:
            if not (in_blocks and reducer in self.block_readers):
                reducer.add(batch)
        tally.n_texts += len(tokens)
        tally.n_batches += 1
        tally.longest = max(tally.longest, int(tokens.input_ids.shape[1]))
        if self.progress is not None:
            self.progress(len(tokens))

    def _run(self, index: int, tokens: TokenBatch):
        """(the model's output, the recorded (scores, probs, allowed) or None, whether it ran in blocks)."""
        net, needs, taps, layers = self.net, self.needs, self.taps, len(self.attending)
        kwargs = {"output_hidden_states": True} if self.hidden else {}
        in_blocks = self.blockwise and (
            self.block_size or _full_bytes(self.model, needs, layers, self.n_heads, tokens) >= _CHECKED_FROM
        )
        if self.attention:
            check_length(net, int(tokens.input_ids.shape[1]))
            rows = (self.block_size or 0) if in_blocks else None
            _check_attention_fits(self.model, needs, layers, self.n_heads, tokens, rows)
        if in_blocks:
            net.set_attn_implementation(BLOCK_NAME)
            try:
                output = _run_blocks(net, index, tokens, self.block_readers, layers, self.block_size or None, kwargs,
                                     self.n_heads, taps)  # fmt: skip
                if self.verify and "blocks" not in self.checked:  # the first batch run in blocks
                    _verify_blocks(net, tokens, layers)
                    self.checked.add("blocks")
            except (AttributeError, TypeError, PosprobeError) as err:
                raise _not_in_blocks(net, err) from err
            finally:
                net.set_attn_implementation(RECORD_NAME)
            return output, None, True
        if self.eager:
            output, scores, probs, allowed = self.eager_recorder.forward(net, tokens, **kwargs)
            if self.verify and "eager" not in self.checked:
                self.eager_recorder.verify(net, tokens, output, scores, probs, allowed)
                self.checked.add("eager")
            recorded = (scores if "scores" in needs else None, probs if "probs" in needs else None, allowed)
            return output, recorded, False
        if self.attention:
            recorder = self.recorder
            recorder.begin(len(tokens), tokens.input_ids.shape[1])
            output = _forward(net, tokens, kwargs, _joined(taps, recorder.taps()))
            _check_calls(net, recorder.calls, layers)
            if self.verify and "whole" not in self.checked:  # the first batch recorded as whole matrices
                plain = output if taps is None else _forward(net, tokens, {}, Taps())
                verify_against_eager(net, tokens.input_ids, tokens.attention_mask, plain)
                self.checked.add("whole")
            recorded = (
                recorder.scores if recorder.keep_scores else None,
                recorder.probs if recorder.keep_probs else None,
                recorder.allowed,
            )
            return output, recorded, False
        return _forward(net, tokens, kwargs, taps), None, False


_CHECKED_FROM = 256 * 2**20  # smaller batches are not checked against the free memory


def _full_bytes(model, needs: set, n_layers: int, n_heads: int, tokens: TokenBatch) -> int:
    """`memory.attention_batch_bytes` of this batch: recording its attention as whole (m x m) matrices."""
    batch, length = tokens.input_ids.shape
    element = next((p.element_size() for p in model.parameters()), 4)
    return attention_batch_bytes(n_layers, n_heads, batch, length, element, "scores" in needs, "probs" in needs)


def _check_attention_fits(
    model, needs: set, n_layers: int, n_heads: int, tokens: TokenBatch, rows: int | None = None
) -> None:
    """Refuse in one line a batch whose recorded attention cannot fit in the free memory (`capture.memory`):
    whole matrices when `rows` is None, else blocks of `rows` query rows (0: about `kernel.routes.BLOCK_ELEMENTS`
    scores)."""
    batch, length = tokens.input_ids.shape
    if rows is not None:
        element = next((p.element_size() for p in model.parameters()), 4)
        width = int(getattr(model.config, "hidden_size", 0) or 0)
        needed = attention_block_bytes(n_heads, batch, length, rows, element, width)
        if needed >= _CHECKED_FROM:
            check_fits(
                needed,
                model_device(model),
                f"the attention of a batch of {batch} text(s) x {length} tokens, in blocks of query rows",
                "use a smaller --batch-size, or a smaller --max-length",
            )
        return
    needed = _full_bytes(model, needs, n_layers, n_heads, tokens)
    if needed >= _CHECKED_FROM:
        check_fits(
            needed,
            model_device(model),
            f"recording the attention of a batch of {batch} text(s) x {length} tokens ({n_layers} layers x "
            f"{n_heads} heads x {length}²)",
            "use a smaller --batch-size, or a smaller --max-length",
        )


def _run_blocks(
    net,
    index: int,
    tokens: TokenBatch,
    readers: list,
    n_layers: int,
    rows: int | None,
    kwargs: dict,
    heads: int,
    taps: Taps | None = None,
):
    """Run one batch on the blockwise route (with `taps` first), handing every block of every layer to `readers`
    (`BlockCapture`s on the inputs' device, `heads` H heads each); returns the model's output."""
    here = tokens.input_ids.device
    counted = tokens.counted

    def hand(layer: int, start: int, scores, probs, allowed) -> None:
        scores, probs, allowed = scores.to(here), probs.to(here), allowed.to(here)
        stop = start + scores.shape[-2]
        tokens_pairs = counted[:, start:stop, None] & counted[:, None, :]
        pairs = allowed & (tokens_pairs if allowed.dim() == 3 else tokens_pairs[:, None])  # a head axis: per head
        block = BlockCapture(index, tokens, layer, start, scores, probs, allowed, pairs)
        for reader in readers:
            reader.add_block(block)

    recorder = BlockRecorder(n_layers, hand, rows, heads)
    recorder.begin(int(tokens.input_ids.shape[1]))
    taps = _joined(taps, recorder.taps())
    output = taps.forward(net, input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, **kwargs)
    _check_calls(net, recorder.calls, n_layers)
    return output


def _joined(edits: Taps | None, taps: Taps) -> Taps:
    """The taps `edits`, then `taps` (the recorders read the edited attention)."""
    return taps if edits is None else edits.joined(taps)


def _not_in_blocks(net, err: Exception) -> PosprobeError:
    """The one-line error of a family whose attention could not be computed in blocks: its model code used the
    row masks as tensors (AttributeError, TypeError), or the blocks did not reproduce its eager outputs."""
    kind = getattr(net.config, "model_type", "unknown")
    what = err.message if isinstance(err, PosprobeError) else f"{type(err).__name__}: {err}"
    return PosprobeError(
        f"'{kind}' could not run its attention in blocks of queries ({what})",
        "pass --block-size 0 (block_size=0: whole matrices, memory quadratic in the length); please report it",
    )


VERIFY_TOKENS = 256  # the blockwise route checks the first batch's first tokens against eager attention


def _verify_blocks(net, tokens: TokenBatch, n_layers: int) -> None:
    """The first batch's check on the blockwise route: its first `VERIFY_TOKENS` tokens run in blocks of a quarter
    of them (so that several blocks and their mask rows are exercised) must give the model's eager outputs."""
    p = min(int(tokens.input_ids.shape[1]), VERIFY_TOKENS)
    ids, mask = tokens.input_ids[:, :p], tokens.attention_mask[:, :p]
    recorder = BlockRecorder(n_layers, None, max(1, p // 4))
    recorder.begin(p)
    output = recorder.taps().forward(net, input_ids=ids, attention_mask=mask)
    _check_calls(net, recorder.calls, n_layers)
    verify_against_eager(net, ids, mask, output, restore=BLOCK_NAME)


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
        if id(allowed) not in seen:  # (B, H, m, m) where the layer's heads pick keys of their own
            seen[id(allowed)] = (token_pairs if allowed.dim() == 3 else token_pairs[:, None]) & allowed
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


def _forward(net, tokens: TokenBatch, kwargs: dict, taps=None):
    """The model's forward pass on one batch (with `taps` on the attention kernel where given); PosprobeError in one
    line where transformers' own code fails on a text alone (a multimodal wrapper whose forward reads outputs its
    language model does not return, as Llama 4's did before posprobe ran its language model alone:
    `Family.language_model_alone`)."""
    inputs = dict(input_ids=tokens.input_ids, attention_mask=tokens.attention_mask, **kwargs)
    try:
        return net(**inputs) if taps is None else taps.forward(net, **inputs)
    except (AttributeError, TypeError, KeyError, IndexError, ValueError) as err:
        kind = getattr(net.config, "model_type", "unknown")
        what = (str(err).strip().splitlines() or [""])[0]
        raise PosprobeError(
            f"'{kind}' fails in its own forward pass on text ({type(err).__name__}: {what})",
            "run its language model alone (a checkpoint of its text stack); please report it",
        ) from err


def _check_hidden(model, hidden: tuple, length: int) -> None:
    """Every hidden state must hold one row per input position: a model that pools the sequence between layers
    (Funnel's blocks) has no state per position at every depth, and is refused, as is one that pads it to a multiple
    of its chunk lengths (Reformer: its padding changes which keys its chunks see); so is one that returns several
    streams per layer (Gemma 3n's AltUp stack, HY-V4's hyper-connection streams; Qwen4-Exp's side by side, a width
    of several times the hidden size)."""
    width = getattr(model.config.get_text_config(), "hidden_size", None)
    side_by_side = [h for h in hidden if width and h.shape[-1] != width and h.shape[-1] % width == 0]
    streams = [h for h in hidden if h.ndim != 3] + side_by_side  # Gemma 3n: a stack of AltUp streams per layer
    if streams:
        shape = tuple(streams[0].shape)
        raise PosprobeError(
            f"the model returns hidden states of shape {shape}, not "
            "(batch, tokens, width) (several streams per layer): posprobe reads one hidden state per layer",
            "run the analyses of attention alone (they need no hidden states)",
        )
    if all(h.shape[1] == length for h in hidden):
        return
    kind = getattr(model.config, "model_type", "unknown")
    padded = max(int(h.shape[1]) for h in hidden)
    if padded > length:  # Reformer: padded to a multiple of its chunk lengths, which changes what its chunks see
        raise PosprobeError(
            f"'{kind}' gives hidden states of other lengths than its input: it pads its {length} positions to "
            f"{padded} (a multiple of its chunk lengths), and that padding changes what the real positions see",
            "run texts of a length it does not pad (a multiple of its chunk lengths, or at most its shortest chunk)",
        )
    raise PosprobeError(
        f"'{kind}' gives hidden states of other lengths than its input (it pools the sequence between layers), so "
        "they cannot be recorded per position",
        "this model's layout is not supported",
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
