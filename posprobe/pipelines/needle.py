"""`posprobe needle` (SPEC §18): retrieval by length and depth — a needle (by default a random pass key) hidden in
a haystack of real text at each (length, depth), scored per prompt by the answer's teacher-forced log-probability,
greedy exact match, and the attention the last prompt token gives the needle in every layer and head.

Order of work: cheap checks first (arguments, the config, the window, the tokenizer and the haystack: every prompt
is built before any weight is read), then the model, then one forward pass per prompt over prompt + answer. Each
prompt's scores depend on that prompt alone (`score_prompt`), so under torchrun (SPEC §19) prompt k is run by rank
k % world alone and the scores are added over the ranks once, from arrays that are zero at the other ranks' prompts
(`posprobe.runtime.distributed`): every rank returns the scores of every prompt, rank 0 alone writes.

The result type is in `needle_result.py`, the prompts in `needle_prompts.py`, the pure scores in
`posprobe.analysis.needle`, the retrieval attention in `posprobe.capture.retrieval`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from os import PathLike
from typing import Any

import numpy as np

from posprobe.analysis.needle import answer_scores
from posprobe.capture.loop import Step
from posprobe.errors import ArgumentTypeError, ArgumentValueError, PosprobeError
from posprobe.pipelines.defaults import (
    NEEDLE_DEPTHS,
    NEEDLE_HAYSTACK,
    NEEDLE_LENGTHS,
    NEEDLE_MODEL,
    NEEDLE_SEED,
    NEEDLE_TRIALS,
)
from posprobe.pipelines.needle_prompts import Haystack, NeedlePrompt, NeedleTask, PromptBuilder
from posprobe.pipelines.needle_result import NeedleResult
from posprobe.validation import as_bool, as_int


@dataclass(frozen=True)
class NeedleGrid:
    """The grid of a run, validated once: `lengths` (tokens, increasing), `depths` (0..1, increasing), `trials`,
    `seed`, and `beyond_window` (lengths past the model's positions allowed)."""

    lengths: tuple[int, ...] = NEEDLE_LENGTHS
    depths: tuple[float, ...] = NEEDLE_DEPTHS
    trials: int = NEEDLE_TRIALS
    seed: int = NEEDLE_SEED
    beyond_window: bool = False

    def __post_init__(self) -> None:
        lengths = _as_list(self.lengths, "lengths")
        depths = _as_list(self.depths, "depths")
        for length in lengths:
            as_int(length, "lengths", minimum=8, hint="pass lengths in tokens, e.g. {arg} 256,512,1024")
        for depth in depths:
            if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not 0.0 <= float(depth) <= 1.0:
                raise ArgumentValueError(
                    "depths",
                    f"depth {depth!r} is outside 0..1 (the share of the haystack before the needle)",
                    "pass depths between 0 and 1, e.g. {arg} 0,0.25,0.5,0.75,1",
                )
        object.__setattr__(self, "lengths", tuple(sorted({int(x) for x in lengths})))
        object.__setattr__(self, "depths", tuple(sorted({float(x) for x in depths})))
        object.__setattr__(self, "trials", as_int(self.trials, "trials", minimum=1, maximum=10_000))
        object.__setattr__(self, "seed", as_int(self.seed, "seed", minimum=0))
        object.__setattr__(self, "beyond_window", as_bool(self.beyond_window, "beyond_window"))

    def cells(self) -> list[tuple[int, int, int]]:
        """(length index, depth index, trial) of every prompt, in the order they run."""
        return [
            (i, j, t) for i in range(len(self.lengths)) for j in range(len(self.depths)) for t in range(self.trials)
        ]


def _as_list(values, name: str) -> list:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ArgumentTypeError(name, f"{{arg}} must be a list of numbers, got {values!r}", "e.g. [0, 0.5, 1]")
    values = list(values)
    if not values:
        raise ArgumentValueError(name, "{arg} is empty", "pass at least one value")
    return values


@dataclass(frozen=True)
class PromptScore:
    """What one prompt gave: `log_prob` of the answer (float64), `exact` greedy match, `greedy_ids` the greedy
    continuation (len(answer) tokens, fewer where it ended at an end-of-text token), `needle_attention` (L, H),
    `token_log_probs` log p of each answer token (they sum to `log_prob`), `retrieval` (L, H) Wu et al. 2024's
    retrieval score of each head on this prompt (NaN where not read: families outside AttentionInterface)."""

    log_prob: float
    exact: bool
    greedy_ids: list[int]
    needle_attention: np.ndarray
    token_log_probs: list[float]
    retrieval: np.ndarray | None = None


def needle(
    model: str | PathLike | Any | None = NEEDLE_MODEL,
    *,
    tokenizer: Any = None,
    haystack: str | PathLike | Iterable[str] = NEEDLE_HAYSTACK,
    grid: NeedleGrid | None = None,
    task: NeedleTask | None = None,
    device: str | None = None,
    progress: Callable[[int, int], None] | None = None,
    allow_pickle: bool = False,
    source: Any = None,
    max_memory: dict | str | None = None,
    taps: Any = None,
    edits: Iterable[str] | str | None = None,
) -> NeedleResult:
    """The needle grid of a causal language model (SPEC §18).

    model: hub id, folder, .gguf file, packaged name, or a loaded causal LM (then pass its `tokenizer`).
    haystack: a text file or builtin name (`posprobe.texts.reading.iter_texts`), or an iterable of texts. grid: lengths,
    depths, trials, seed (`NeedleGrid`); task: intro, needle and question templates, answer (`NeedleTask`).
    progress(done, total) after each prompt (under torchrun: every rank's prompts counted). device: cpu, cuda, ...
    (None: cuda if available for a checkpoint; a model object stays where it is) or 'auto' (accelerate's big-model
    inference, with `max_memory` per device, e.g. {'cpu': '8GiB'}: past it, layers go to disk). taps: taps on the
    attention kernel (`posprobe.kernel.Taps`) applied in every forward pass, before the needle row is read. edits:
    the user's edits (SPEC §20: strings such as 'head:18.6', or parsed `posprobe.edits` objects), checked against
    the config before any weight is read and applied in every forward pass and greedy continuation. Returns a
    `NeedleResult` whose arrays are shaped (lengths, depths, trials[, layers, heads]).
    """
    from torch import nn

    from posprobe.capture.model import check_max_memory, dispatch_settings

    check_max_memory(device, max_memory)
    grid = NeedleGrid() if grid is None else grid
    task = NeedleTask() if task is None else task
    if not isinstance(grid, NeedleGrid):
        raise ArgumentTypeError("grid", f"{{arg}} must be a NeedleGrid, got {type(grid).__name__}",
                                "e.g. grid=NeedleGrid(lengths=[256, 512], depths=[0, 0.5, 1])")  # fmt: skip
    if not isinstance(task, NeedleTask):
        raise ArgumentTypeError("task", f"{{arg}} must be a NeedleTask, got {type(task).__name__}",
                                "e.g. task=NeedleTask(needle=' The secret word is {answer}.')")  # fmt: skip
    net = model if isinstance(model, nn.Module) else None
    if net is not None:
        if tokenizer is None:
            raise ArgumentValueError("tokenizer", "a model object carries no tokenizer", "pass {arg}=its tokenizer")
        name = str(getattr(net.config, "_name_or_path", "") or "model")
        config, quantization = net.config.to_dict(), None
    else:
        from posprobe.checkpoint import resolve_model

        source = source or resolve_model(model, allow_pickle=allow_pickle, with_tokenizer=True)
        config, name, quantization = source.config, source.label, source.quantization
    _check_causal(config, name)
    _check_one_row(config, name)
    window = _window(config)
    _check_window(grid.lengths, 0, window, grid.beyond_window)
    if tokenizer is None:
        from posprobe.checkpoint.loading import load_tokenizer

        tokenizer = load_tokenizer(source.path, "use a model folder or .gguf file that holds its tokenizer")
    hay_name, texts = _haystack_texts(haystack)
    encode = lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    builder = PromptBuilder(task, Haystack(texts, encode, hay_name), tokenizer, grid.seed)
    task = replace(task, chat=builder.chat)  # the format the prompts have (None: the tokenizer's template, if any)
    prompts = [builder.build(grid.lengths[i], grid.depths[j], t) for i, j, t in grid.cells()]
    _check_window(grid.lengths, max(len(p.answer_ids) for p in prompts), window, grid.beyond_window)
    from posprobe.edits import describe, prepare_edits

    edits = prepare_edits(edits, config, name, max(len(p.prompt_ids) + len(p.answer_ids) for p in prompts))
    from posprobe.capture.model import check_model, place_on, resolve_device

    if net is None:
        net = _load_causal_lm(source, dispatch_settings(device, max_memory))
        net = place_on(net, resolve_device(None if device == "auto" else device))
    elif device is not None and device != "auto":
        net = net.to(resolve_device(device))
    n_layers, n_heads = check_model(net)
    from posprobe.capture.eager import is_eager_route
    from posprobe.capture.loop import run

    eager = is_eager_route(net)
    keep = _takes(net, "logits_to_keep")
    from posprobe.capture.retrieval import TopKeys

    top_keys = None if eager else TopKeys(n_layers, n_heads)  # Wu's retrieval score: the kernel's "rows" site
    reducer = PromptScores(prompts, n_layers, n_heads, top_keys)
    taps = taps if top_keys is None else top_keys.taps() if taps is None else taps.joined(top_keys.taps())
    steps = (prompt_step(prompt, keep) for prompt in prompts)
    run(net, steps, [reducer], taps, edits=edits, total=len(prompts), progress=progress, shape=(n_layers, n_heads))
    scores = reducer.result()
    if progress is not None:
        progress(len(prompts), len(prompts))  # the last prompts may have run on other ranks
    return NeedleResult.from_scores(
        model=name,
        model_type=str(config.get("model_type", "unknown")),
        quantization=quantization,
        haystack=hay_name,
        task=task,
        grid=grid,
        window=window,
        prompts=prompts,
        scores=scores,
        decode=lambda ids: tokenizer.decode(list(ids)),
        n_layers=n_layers,
        n_heads=n_heads,
        route="eager (the model's own softmax rows)" if eager else "sdpa output + the last query row recomputed",
        edits=describe(edits),
    )


def prompt_step(prompt: NeedlePrompt, keep: bool) -> Step:
    """The run-loop step of one prompt: one forward pass over prompt + answer reading the last prompt token's
    attention on the needle (`keep`: the model takes `logits_to_keep`, and only the answer's logits are made)."""
    prompt_len, answer_len = len(prompt.prompt_ids), len(prompt.answer_ids)
    kwargs: dict[str, Any] = {"use_cache": False}
    if keep:
        kwargs["logits_to_keep"] = answer_len + 1
    return Step([list(prompt.prompt_ids) + list(prompt.answer_ids)], prompt_len - 1, [prompt.needle_span], kwargs,
                prompt)  # fmt: skip


def prompt_score(model, prompt: NeedlePrompt, logits, attention, device, taps=None) -> PromptScore:
    """One prompt's scores from its forward pass: `logits` (1, m or answer + 1, V), `attention` (1, L, H) of the last
    prompt token on the needle. Where greedy decoding departs from the answer, the rest of its continuation is
    generated (with `taps` on the attention kernel, where given; the run's edit hooks stay installed meanwhile)."""
    prompt_len, answer_len = len(prompt.prompt_ids), len(prompt.answer_ids)
    keep = logits.shape[1] != prompt_len + answer_len
    logits = logits[0, -(answer_len + 1) : -1] if keep else logits[0, prompt_len - 1 : -1]
    token_log_probs, exact, greedy = answer_scores(logits, prompt.answer_ids)
    if not exact and len(greedy) < answer_len:
        greedy = _continue_greedy(model, list(prompt.prompt_ids) + greedy, answer_len - len(greedy), device, taps)[
            prompt_len:
        ]
    return PromptScore(math.fsum(token_log_probs), exact, greedy, attention[0].cpu().numpy(), token_log_probs)


def score_prompt(run, prompt: NeedlePrompt, device) -> PromptScore:
    """One prompt's scores from one forward pass over prompt + answer (`run` a `capture.retrieval.RetrievalRun`)."""
    import torch

    step = prompt_step(prompt, _takes(run.model, "logits_to_keep"))
    ids = torch.tensor(step.input_ids, device=device)
    output, attention = run.forward(ids, step.row, step.spans, **step.kwargs)
    return prompt_score(run.model, prompt, output.logits, attention, device)


class PromptScores:
    """The step reducer of a needle grid: each prompt's `PromptScore` (refused where not finite), every prompt's on
    every rank once merged (`merge_ranks`); `result()` in prompt order. With `top_keys` (a `TopKeys` whose taps run
    in the same forward passes) each score carries Wu et al. 2024's retrieval score per head."""

    needs = ("logits", "rows")

    def __init__(self, prompts: Sequence[NeedlePrompt], n_layers: int, n_heads: int, top_keys=None):
        self.prompts, self.n_layers, self.n_heads = prompts, n_layers, n_heads
        self.top_keys = top_keys
        self.mine: dict[int, PromptScore] = {}

    def add_output(self, out) -> None:
        prompt = out.step.meta
        top = self.top_keys.take()[0] if self.top_keys is not None else None  # (L, H, m)
        score = prompt_score(out.model, prompt, out.logits, out.rows, out.input_ids.device, out.taps)
        if top is not None:
            score = replace(score, retrieval=self._retrieval(out, prompt, score, top))
        self.mine[out.index] = _finite_score(score, out.index, prompt)

    def _retrieval(self, out, prompt: NeedlePrompt, score: PromptScore, top) -> np.ndarray:
        """(L, H) Wu's retrieval score of one prompt: from the teacher-forced pass `top` where greedy decoding gives
        the answer, otherwise from the decoding steps, re-read in one pass over the prompt and the greedy
        continuation (what decoding computes, step by step), with this run's taps (its edits' and the reader's)."""
        import torch

        from posprobe.analysis.needle import retrieval_hits, retrieval_score
        from posprobe.kernel import Taps

        p, answer = len(prompt.prompt_ids), list(prompt.answer_ids)
        ids, generated = list(prompt.prompt_ids) + answer, answer
        if not score.exact:
            generated = list(score.greedy_ids)
            ids = list(prompt.prompt_ids) + generated[:-1]
            self.top_keys.reset()
            rows = out.taps.joined(Taps(row=p - 1))  # the rows from the last prompt token on
            rows.forward(out.model, input_ids=torch.tensor([ids], device=out.input_ids.device), use_cache=False)
            top = self.top_keys.take()[0]
        steps = top[:, :, : len(generated)]  # (L, H, steps): rows p - 1 .. p - 2 + len(generated)
        return retrieval_score(retrieval_hits(steps, ids, prompt.needle_span, generated), len(answer))

    def merge_ranks(self) -> None:
        merged = _merge_ranks(self.mine, self.prompts, self.n_layers, self.n_heads)
        self.mine = dict(enumerate(merged))

    def result(self) -> list[PromptScore]:
        return [self.mine[k] for k in range(len(self.prompts))]


def _finite_score(score: PromptScore, index: int, prompt: NeedlePrompt) -> PromptScore:
    """`score`, refused in one line where the answer's log-probability is NaN or infinite (a broken or overflowing
    model: every mean over the grid would be NaN)."""
    if not math.isfinite(score.log_prob):
        raise PosprobeError(
            f"the model gives a NaN or infinite log-probability on prompt {index} ({prompt.achieved_length} tokens): "
            "its logits overflow or it holds NaN",
            "check the checkpoint (its weights and dtype), or use another model",
        )
    return score


def _merge_ranks(mine: dict[int, PromptScore], prompts: Sequence[NeedlePrompt], n_layers: int, n_heads: int):
    """Every prompt's score on every rank (SPEC §19), from this rank's `mine` (prompt index -> score): per-prompt
    arrays, zero at the prompts other ranks ran, added over the ranks (one rank ran each prompt, so the sums are
    its values exactly). Greedy ids are padded with -1 to the longest answer, answer log-probabilities with NaN."""
    from posprobe.runtime import distributed

    n, width = len(prompts), max(len(p.answer_ids) for p in prompts)
    log_prob, exact = np.zeros(n), np.zeros(n, dtype=np.int64)
    greedy, token_lp = np.zeros((n, width), dtype=np.int64), np.zeros((n, width))
    attention, retrieval = np.zeros((n, n_layers, n_heads)), np.zeros((n, n_layers, n_heads))
    for k, score in mine.items():
        log_prob[k], exact[k] = score.log_prob, int(score.exact)
        greedy[k] = -1
        greedy[k, : len(score.greedy_ids)] = score.greedy_ids
        token_lp[k] = np.nan
        token_lp[k, : len(score.token_log_probs)] = score.token_log_probs
        attention[k] = score.needle_attention
        retrieval[k] = np.nan if score.retrieval is None else score.retrieval
    log_prob, exact, greedy, token_lp, attention, retrieval = (
        distributed.all_reduce_sum(a) for a in (log_prob, exact, greedy, token_lp, attention, retrieval)
    )
    return [
        PromptScore(
            float(log_prob[k]),
            bool(exact[k]),
            [int(x) for x in greedy[k] if x >= 0],
            attention[k],
            [float(x) for x in token_lp[k, : len(prompts[k].answer_ids)]],
            retrieval[k],
        )
        for k in range(n)
    ]


def _continue_greedy(model, ids: list[int], new_tokens: int, device, taps=None) -> list[int]:
    """`ids` followed by `new_tokens` greedy tokens (transformers' generate, no sampling, no penalties; `taps` on
    the attention kernel in every step where given)."""
    import torch
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, num_beams=1, max_new_tokens=new_tokens, repetition_penalty=1.0)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    config.eos_token_id, config.pad_token_id = eos, eos if isinstance(eos, int) else None
    input_ids = torch.tensor([ids], device=device)
    if taps is None:
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config)
        return out[0].tolist()
    taps.start()
    with taps.handed(model):  # generate takes no extra keyword: the taps are handed to the attention modules
        out = model.generate(input_ids, attention_mask=torch.ones_like(input_ids), generation_config=config)
    return out[0].tolist()


def _takes(model, name: str) -> bool:
    try:
        return name in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False


def _check_causal(config: dict, name: str) -> None:
    """Refuse encoders and encoder-decoders (the answer must be the model's own continuation): the family table says
    whether a family is causal (a Gemma 3 set to attend both ways is not); a type it lacks must be one transformers
    builds a causal LM for."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from posprobe.architectures import table as T

    kind = str(config.get("model_type", "unknown"))
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    family = T.family_for_type(kind) or T.family_for_type(str(text.get("model_type", kind)))
    if family is not None:
        causal = T.is_causal(family, text)
    else:
        causal = kind in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    if config.get("is_encoder_decoder") or not causal:
        raise PosprobeError(
            f"'{name}' ({kind}) is not a causal language model: posprobe needle asks for the answer as the model's "
            "continuation",
            "pass a decoder (GPT-like) model, e.g. SmolLM2-135M-Instruct",
        )


def _check_one_row(config: dict, name: str) -> None:
    """Refuse a family whose layers give a query no one softmax row over the sequence's keys, saying which layers
    and why: layers whose pairs a hash draw picks (`Family.tensors['unscored_softmax_layers']`: Reformer's LSH
    layers, per head and hash round) and layers that attend within chunks (`Family.windows` 'neighbour_chunks')."""
    from posprobe.architectures import table as T

    kind = str(config.get("model_type", "unknown"))
    family = T.family_for_type(kind)
    if family is None:
        return
    hashed, chunked = family.tensors.get("unscored_softmax_layers"), family.windows == "neighbour_chunks"
    if not hashed and not chunked:
        return
    kinds = set(config.get(family.tensors.get("layer_types", ""), None) or ())
    reasons = []
    if hashed and (hashed in kinds or not kinds):
        reasons.append(f"its '{hashed}' layers attend the pairs a random hash draw picks, per head and hash round")
    others = sorted(kinds - {hashed}) if kinds else []
    chunks = chunked and bool(others or not kinds)
    if chunks:
        named = "/".join(f"'{k}'" for k in others) or "local"
        reasons.append(f"its {named} layers attend within chunks of keys (a chunk and its neighbours)")
    if not reasons:
        return
    raise PosprobeError(
        f"'{name}' ({kind}) gives a query no one attention row over the sequence's keys: " + "; ".join(reasons),
        "read its chunked layers' attention on text with `posprobe attention`"
        if chunks
        else "`posprobe states` reads its hidden states",
    )


def _window(config: dict) -> int | None:
    """The model's trained positions (max_position_embeddings / n_positions), None where the config has none."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"):
        value = text.get(key) or config.get(key)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _check_window(lengths: Sequence[int], answer_tokens: int, window: int | None, beyond: bool) -> None:
    """Refuse a length whose prompt + answer passes the model's positions, unless `beyond` says so."""
    if window is None or beyond:
        return
    longest = max(lengths)
    if longest + answer_tokens > window:
        answer = f" plus the answer's {answer_tokens} tokens" if answer_tokens else ""
        raise ArgumentValueError(
            "lengths",
            f"a length of {longest} tokens{answer} passes the model's window of {window} positions",
            f"use {{arg}} up to {window - max(answer_tokens, 1)}, or --beyond-window to measure past the window",
        )


def _haystack_texts(haystack) -> tuple[str, Iterable[str]]:
    """(name, texts) of a haystack given as a file or builtin name, or as an iterable of texts."""
    import os

    if isinstance(haystack, (str, os.PathLike)):
        from posprobe.texts.reading import iter_texts

        return str(haystack), iter_texts(haystack)
    if isinstance(haystack, Iterable) and not isinstance(haystack, bytes):
        return "the given texts", (str(text) for text in haystack)
    raise ArgumentTypeError("haystack", f"{{arg}} must be a file, a builtin name or texts, got {haystack!r}", None)


def _load_causal_lm(source, dispatch: dict | None = None):
    """The causal LM of a resolved checkpoint (its default attention, eager for families outside
    AttentionInterface; the retrieval run switches it); `dispatch`: `dispatch_settings`' keywords (accelerate's
    device map) or {}."""
    import transformers
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from posprobe.checkpoint.loading import build_model

    # families outside AttentionInterface are read on their eager path, and some (Falcon) cannot switch to it
    # after loading
    cls = getattr(transformers, str(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(source.model_type, "")), None)
    eager_only = hasattr(cls, "is_backend_compatible") and not cls.is_backend_compatible()
    return build_model(source, AutoModelForCausalLM, **({"attn_implementation": "eager"} if eager_only else {}),
                       **(dispatch or {}))  # fmt: skip
