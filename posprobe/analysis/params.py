"""Positional parameter counts from a model's config (SPEC §8; seed paper TISA, Table 2).

Pure Python (no torch): the input is the parsed ``config.json`` dict, whose key names differ per family
(BERT ``hidden_size``, GPT-2 ``n_embd``, DistilBERT ``dim``, ...). Counts:

- absolute learned position table: ``n * d``, with ``d`` the width of the position table (the family's
  ``position_width`` config keys: ``embedding_size`` for ALBERT/ELECTRA, which factorise their embeddings,
  RemBERT's ``input_embedding_size``, MobileBERT's hidden size) — only for models whose config gives them a
  learned absolute table (ESM with absolute positions, DeBERTa with ``position_biased_input``, ...); others
  (rotary, relative buckets, ALiBi, sinusoidal) report ``None`` and say what they use instead;
- untied positional attention (Ke et al.): ``n * d + 2 * d^2`` (same condition);
- every retrofittable mechanism of `posprobe.mechanisms.catalogue` (TISA ``3 * S * H * L``, fixed
  ``H * (2r + 1) * L``, dynamic ``(2r + 1) * d_h * L``, composite, ...): the catalogue's count per depth
  times ``L`` (ALBERT's layers share weights but get distinct mechanisms at every depth, as in the paper).

RoBERTa-family tables (roberta, xlm-roberta, camembert, longformer, xmod, esm) reserve ``pad_token_id + 1``
leading rows, so ``n = max_position_embeddings - (pad_token_id + 1)`` usable positions (514 -> 512); OPT, BART,
mBART and BioGPT store 2 rows more than ``max_position_embeddings``, the positions they use (n = 2048 of 2050).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from posprobe.architectures import table as T
from posprobe.architectures.config import config_size, reserved_rows
from posprobe.architectures.table import KIND_NAMES, LEARNED, family_for_type, position_kind
from posprobe.errors import PosprobeError
from posprobe.mechanisms.catalogue import CATALOGUE, DEFAULT_RADIUS, LayerShape, check_kernels, check_radius
from posprobe.validation import as_int_list

DEFAULT_KERNELS = (1, 3, 5)
LEARNED_TABLE = KIND_NAMES[LEARNED]


@dataclass(frozen=True)
class PositionalParams:
    """Positional parameter counts of one architecture (integers) and the sizes they come from.

    `absolute` / `untied` are None when the model has no learned absolute table (`position_encoding` says
    what it has). `mechanisms`: name -> parameters a retrofit adds (all catalogue mechanisms, TISA with
    S = 5); `tisa`: S -> count for each requested S."""

    model_type: str
    position_encoding: str
    n_positions: int | None  # None: no position limit in the config (ALiBi, relative buckets)
    reserved_rows: int
    table_width: int
    hidden_size: int
    n_heads: int
    n_layers: int
    head_dim: int
    radius: int
    absolute: int | None
    untied: int | None
    tisa: dict[int, int] = field(default_factory=dict)
    mechanisms: dict[str, int] = field(default_factory=dict)
    fixed_conv: int = 0
    dynamic_conv: int = 0
    composite: int = 0

    @property
    def has_learned_table(self) -> bool:
        return self.absolute is not None

    def to_json(self) -> dict:
        out = asdict(self)
        out["tisa"] = {str(s): v for s, v in self.tisa.items()}
        out["formulas"] = {
            "absolute": "n*d",
            "untied": "n*d + 2*d^2",
            "fixed_conv": "H*(2r+1)*L",
            "dynamic_conv": "(2r+1)*d_h*L",
            "composite": "fixed_conv + dynamic_conv",
            **{name: info.total_formula for name, info in CATALOGUE.items()},
        }
        return out


def positional_encoding(config: dict) -> str:
    """What `config`'s family uses for positions (from the family table): `LEARNED_TABLE` or a description of
    the alternative."""
    return position_kind(config)[1]


def has_learned_table(config: dict) -> bool:
    """True when the family table says `config`'s checkpoints store a learned absolute position table (config
    switches included: ESM's position_embedding_type, DeBERTa's position_biased_input)."""
    return T.has_learned_table(config)


def _axial(family, config: dict) -> bool:
    """True when the family builds its table from axial factor tables and `config` turns them on (Reformer)."""
    return "axial_parameters" in family.tensors and T.config_flag(config, family.tensors["axial_switch"])


def positional_parameter_counts(
    config: dict, radius: int = DEFAULT_RADIUS, kernels: tuple[int, ...] | list[int] = DEFAULT_KERNELS
) -> PositionalParams:
    """Table-2 style counts for the architecture described by `config` (a parsed config.json).

    radius: clip radius r of the convolution mechanisms (kernel 2r+1); kernels: the TISA S values to count.
    """
    if not isinstance(config, dict):
        raise PosprobeError("the model config must be a dict (parsed config.json)", "pass the parsed config")
    radius = check_radius(radius)
    kernel_list = [check_kernels(s) for s in as_int_list(kernels, "kernels", allow_none=False)]
    model_type = str(config.get("model_type", "unknown"))
    config = T.language_model_config(config)  # a multimodal wrapper: its language model's
    encoding = positional_encoding(config)
    family = family_for_type(model_type)
    if family is not None:  # the sizes of the stack the family reads (Whisper's decoder)
        config = T.stack_sizes(family, config)
    hidden = config_size(config, None, "hidden")
    widths = family.position_width if family is not None else ("embedding_size",)
    table_width = next((config[k] for k in widths if config.get(k)), hidden)
    learned = has_learned_table(config)
    n_table = config_size(config, None, "positions", required=learned)  # ALiBi / bucket models may state no limit
    heads = config_size(config, None, "heads")
    layers = config_size(config, None, "layers")
    reserved = reserved_rows(config, "the model") if learned else 0
    n = None if n_table is None else n_table - reserved
    if n is not None and n < 1:
        raise PosprobeError(
            f"the position table has {n_table} rows but {reserved} are reserved",
            "check max_position_embeddings and pad_token_id in config.json",
        )
    head_dim = config_size(config, None, "head_dim", required=False)  # T5's d_kv; else hidden / heads
    latent = [config_size(config, None, k, required=False) for k in ("latent_head_dim", "latent_rope_dim")]
    if family is not None and family.qkv == T.LATENT and None not in latent:  # MLA: q.k spans both parts of a head
        head_dim = sum(latent)
    if head_dim is None:
        if hidden % heads:
            raise PosprobeError(f"hidden size {hidden} is not divisible by {heads} heads", "check config.json")
        head_dim = hidden // heads
    shape = LayerShape(num_heads=heads, head_dim=head_dim, input_size=hidden)

    def total(name: str, **options) -> int:
        info = CATALOGUE[name]
        return layers * info.parameters_per_depth(shape, info.options(radius=radius, **options))

    mechanisms = {name: total(name) for name in CATALOGUE}
    absolute = n * table_width if learned else None
    if learned and family is not None and _axial(family, config):  # Reformer: factor tables, concatenated per row
        rows, widths = (
            config.get(k) or T.config_default(config, (k,)) for k in family.tensors["axial_parameters"].split(",")
        )
        absolute = sum(int(r) * int(w) for r, w in zip(rows, widths, strict=True))
    return PositionalParams(
        model_type=model_type,
        position_encoding=encoding,
        n_positions=n,
        reserved_rows=reserved,
        table_width=table_width,
        hidden_size=hidden,
        n_heads=heads,
        n_layers=layers,
        head_dim=head_dim,
        radius=radius,
        absolute=absolute,
        untied=None if absolute is None else absolute + 2 * table_width**2,
        tisa={s: total("tisa", kernels=s) for s in sorted(kernel_list)},
        mechanisms=mechanisms,
        fixed_conv=mechanisms["fixed"],
        dynamic_conv=mechanisms["dynamic"],
        composite=mechanisms["composite"],
    )
