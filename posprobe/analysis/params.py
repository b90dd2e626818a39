"""Positional parameter counts from a model's config (SPEC §8; seed paper TISA, Table 2).

Pure Python: the input is the parsed ``config.json`` dict, whose key names differ per family
(BERT ``hidden_size``, GPT-2 ``n_embd``, DistilBERT ``dim``, ...). Counts:

- absolute learned position table: ``n * d``, with ``d`` the width of the position table
  (``embedding_size`` for ALBERT/ELECTRA, which factorise their embeddings);
- untied positional attention (Ke et al.): ``n * d + 2 * d^2``;
- TISA: ``3 * S * H * L`` (one scoring function per head and layer, also for ALBERT, whose layers
  share weights but get distinct TISA functions, as in the paper);
- fixed lightweight convolution: ``H * (2r + 1)`` per layer, times ``L``;
- dynamic lightweight convolution: ``(2r + 1) * d_h`` per layer, times ``L``;
- composite attention: fixed + dynamic.

RoBERTa-family tables (roberta, xlm-roberta, camembert, longformer) reserve ``pad_token_id + 1`` leading rows,
so ``n = max_position_embeddings - (pad_token_id + 1)`` usable positions (514 -> 512).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from posprobe.errors import PosprobeError

DEFAULT_RADIUS = 8
DEFAULT_KERNELS = (1, 3, 5)
_ROBERTA_LIKE = {"roberta", "xlm-roberta", "camembert", "longformer"}
_KEYS = {
    "hidden": ("hidden_size", "n_embd", "dim", "d_model"),
    "positions": ("max_position_embeddings", "n_positions", "n_ctx"),
    "heads": ("num_attention_heads", "n_head", "n_heads"),
    "layers": ("num_hidden_layers", "n_layer", "n_layers"),
}


@dataclass(frozen=True)
class PositionalParams:
    """Positional parameter counts of one architecture (integers) and the sizes they come from."""

    model_type: str
    n_positions: int
    reserved_rows: int
    table_width: int
    hidden_size: int
    n_heads: int
    n_layers: int
    head_dim: int
    radius: int
    absolute: int
    untied: int
    tisa: dict[int, int] = field(default_factory=dict)
    fixed_conv: int = 0
    dynamic_conv: int = 0
    composite: int = 0

    def to_json(self) -> dict:
        out = asdict(self)
        out["tisa"] = {str(s): v for s, v in self.tisa.items()}
        out["formulas"] = {
            "absolute": "n*d",
            "untied": "n*d + 2*d^2",
            "tisa": "3*S*H*L",
            "fixed_conv": "H*(2r+1)*L",
            "dynamic_conv": "(2r+1)*d_h*L",
            "composite": "fixed_conv + dynamic_conv",
        }
        return out


def _get(config: dict, what: str) -> int:
    for key in _KEYS[what]:
        value = config.get(key)
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PosprobeError(
                    f"config field '{key}' = {value!r} is not a positive whole number", "check the model's config.json"
                )
            return value
    raise PosprobeError(
        f"the config has no {what} field (looked for {', '.join(_KEYS[what])})",
        "pass a model whose config.json describes a transformer with learned positions",
    )


def positional_parameter_counts(
    config: dict, radius: int = DEFAULT_RADIUS, kernels: tuple[int, ...] | list[int] = DEFAULT_KERNELS
) -> PositionalParams:
    """Table-2 style counts for the architecture described by `config` (a parsed config.json)."""
    if not isinstance(config, dict):
        raise PosprobeError("the model config must be a dict (parsed config.json)", "pass the parsed config")
    if isinstance(radius, bool) or not isinstance(radius, int) or radius < 0:
        raise PosprobeError(
            f"the convolution radius must be a whole number >= 0, got {radius!r}",
            "pass e.g. --radius 8 (kernel size 2r+1 = 17)",
        )
    for s in kernels:
        if isinstance(s, bool) or not isinstance(s, int) or s < 1:
            raise PosprobeError(
                f"the number of TISA kernels must be a whole number >= 1, got {s!r}", "pass e.g. 1, 3 or 5"
            )
    model_type = str(config.get("model_type", "unknown"))
    hidden = _get(config, "hidden")
    table_width = config.get("embedding_size") or hidden
    n_table = _get(config, "positions")
    heads = _get(config, "heads")
    layers = _get(config, "layers")
    reserved = 0
    if model_type in _ROBERTA_LIKE:
        pad = config.get("pad_token_id")
        reserved = (1 if pad is None else int(pad)) + 1
    n = n_table - reserved
    if n < 1:
        raise PosprobeError(
            f"the position table has {n_table} rows but {reserved} are reserved",
            "check max_position_embeddings and pad_token_id in config.json",
        )
    if hidden % heads:
        raise PosprobeError(f"hidden size {hidden} is not divisible by {heads} heads", "check config.json")
    head_dim = hidden // heads
    width = 2 * radius + 1
    absolute = n * table_width
    fixed = heads * width * layers
    dynamic = width * head_dim * layers
    return PositionalParams(
        model_type=model_type,
        n_positions=n,
        reserved_rows=reserved,
        table_width=table_width,
        hidden_size=hidden,
        n_heads=heads,
        n_layers=layers,
        head_dim=head_dim,
        radius=radius,
        absolute=absolute,
        untied=absolute + 2 * table_width**2,
        tisa={s: 3 * s * heads * layers for s in sorted(set(kernels))},
        fixed_conv=fixed,
        dynamic_conv=dynamic,
        composite=fixed + dynamic,
    )
