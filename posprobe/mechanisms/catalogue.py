"""What each positional mechanism is, without torch: name, summary, options, parameter count.

This is the one list of mechanisms. The torch classes (one module each, next to this file) register against
it (`base.register` refuses a class whose name is not here), `REGISTRY` is built from it, and the CLI's
`--help`, `params`, `retrofit --json` and the validation of settings read it without importing torch.

Each mechanism owns an options dataclass (its settings with their defaults and limits, checked on
construction) and its parameter count per attention depth as a function of the layer shape and the
options (SPEC §8; a model with L depths adds L times that: ALBERT's shared layer gets its own mechanism
at every depth). A test checks every count against the parameters the torch module really creates.

Each entry also says how its parameters read as functions of `k = j - i` (`reading`, from `reading.py`;
`read_over_k` applies it), whether its `functions` array is a score bias added to the scores (`static_bias`),
whether text turns its tables into scores (`reads_text`) and the half-width `posprobe learned` shows by default
(`window`; None: the clip radius). Nothing outside this package branches on mechanism names.

`check_settings(mechanism, radius=, kernels=, init=)` validates a whole retrofit request cheaply (a
`fit:FILE` kernels file is read and validated, no model is loaded): `retrofit`, the CLI and `finetune` call it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from importlib import import_module

from posprobe.errors import ArgumentValueError
from posprobe.mechanisms import reading as R
from posprobe.validation import as_choice, as_int

DEFAULT_RADIUS = 8
MAX_RADIUS = 4096
DEFAULT_KERNELS = 5
MAX_KERNELS = 256
RADIUS_HINT = "the convolution paper uses {arg} 8 (kernel size 2r+1 = 17)"
KERNELS_HINT = "the TISA paper uses {arg} 5"


@dataclass(frozen=True)
class LayerShape:
    """Sizes of the attention layer a mechanism is installed in."""

    num_heads: int  # H
    head_dim: int  # d_h
    input_size: int  # d, the width of the hidden states fed to the Q/K/V projections

    @property
    def inner_size(self) -> int:
        return self.num_heads * self.head_dim


def check_radius(value) -> int:
    """The clip radius r (kernel size 2r+1) of the relative and convolution mechanisms: 1..MAX_RADIUS."""
    return as_int(value, "radius", minimum=1, maximum=MAX_RADIUS, hint=RADIUS_HINT)


def check_kernels(value) -> int:
    """TISA's number of Gaussian kernels per head S: 1..MAX_KERNELS."""
    return as_int(value, "kernels", minimum=1, maximum=MAX_KERNELS, hint=KERNELS_HINT)


@dataclass(frozen=True)
class RadiusOptions:
    """Options of the clipped relative / convolution mechanisms: offsets `kc = clip(j - i, -r, r)`."""

    radius: int = DEFAULT_RADIUS

    def __post_init__(self):
        object.__setattr__(self, "radius", check_radius(self.radius))


@dataclass(frozen=True)
class TisaOptions:
    """TISA: `kernels` S Gaussian kernels per head; `radius` only spreads the initial centres over [-r, r]."""

    kernels: int = DEFAULT_KERNELS
    radius: int = DEFAULT_RADIUS

    def __post_init__(self):
        object.__setattr__(self, "kernels", check_kernels(self.kernels))
        object.__setattr__(self, "radius", check_radius(self.radius))


Options = RadiusOptions | TisaOptions


@dataclass(frozen=True)
class MechanismInfo:
    """One catalogue entry. `count(shape, options)` = parameters added at one attention depth; `formula`
    says the same in SPEC notation; `module`/`class_name` locate the torch class (loaded on demand)."""

    name: str
    summary: str
    options_class: type
    count: Callable[[LayerShape, Options], int]
    formula: str
    module: str
    class_name: str
    supports_fit: bool = False  # can be initialised from a TISA kernels file (`--init fit[:FILE]`)
    reading: Callable | None = None  # (params, offsets, means) -> {array: values}: `reading.py`, SPEC §11
    static_bias: bool = False  # its `functions` (L, H, K) is a bias added to the scores (parts' biases add up)
    reads_text: bool = False  # mean query/key/value of real text turn its per-offset tables into scores
    window: int | None = None  # half-width W of k = -W..W that `posprobe learned` shows; None: the clip radius

    def read_over_k(self, params, offsets, means=None) -> dict:
        """This mechanism's parameters `{name: (L, ...)}` (stacked over depths) as functions of `k = j - i` at
        `offsets` (K,): `{array name: values}` (`posprobe.analysis.learned` lists them). `means`: role ->
        `(L, H, d_h)` mean vectors of real text, or None."""
        import numpy as np

        if self.reading is None:
            raise ValueError(f"mechanism '{self.name}' has no reading over k; read each of its parts")
        params = {k: np.asarray(v, dtype=np.float64) for k, v in params.items()}
        return self.reading(params, offsets, means or {})

    def options(self, **values) -> Options:
        """This mechanism's options from keyword values (None = default; keys it does not use are ignored)."""
        names = {f.name for f in fields(self.options_class)}
        return self.options_class(**{k: v for k, v in values.items() if k in names and v is not None})

    @property
    def takes_kernels(self) -> bool:
        """True when its options hold the number of kernels S, so its size depends on S (TISA)."""
        return "kernels" in {f.name for f in fields(self.options_class)}

    @property
    def total_formula(self) -> str:
        """`formula` for a whole model of L depths, e.g. 'L·H·(2r+1)'."""
        return f"L·{self.formula}"

    def parameters_per_depth(self, shape: LayerShape, options: Options | None = None) -> int:
        return int(self.count(shape, options if options is not None else self.options_class()))

    def load(self) -> type:
        """The torch class (imports torch)."""
        return getattr(import_module(self.module), self.class_name)


def _w(o) -> int:
    return 2 * o.radius + 1


def _half(s: LayerShape) -> int:
    return (s.num_heads // 2) * s.head_dim


_ENTRIES = [
    MechanismInfo(
        "tisa",
        "Gaussian-kernel scoring function f(j-i) per head (S kernels)",
        TisaOptions,
        lambda s, o: 3 * o.kernels * s.num_heads,
        "3·S·H",
        "posprobe.mechanisms.tisa",
        "TISA",
        supports_fit=True,
        reading=R.read_tisa,
        static_bias=True,
        window=16,  # the Gaussians reach beyond the radius, which only spreads their initial centres
    ),
    MechanismInfo(
        "fixed",
        "per-head scalar bias beta[h, clip(j-i)] (T5 style, fixed lightweight convolution)",
        RadiusOptions,
        lambda s, o: s.num_heads * _w(o),
        "H·(2r+1)",
        "posprobe.mechanisms.fixed",
        "FixedConvolution",
        reading=R.read_fixed,
        static_bias=True,
    ),
    MechanismInfo(
        "dynamic",
        "query-based relative keys q_i . w[clip(j-i)] / sqrt(d_h) (Shaw, dynamic lightweight convolution)",
        RadiusOptions,
        lambda s, o: _w(o) * s.head_dim,
        "(2r+1)·d_h",
        "posprobe.mechanisms.dynamic",
        "DynamicConvolution",
        reading=R.read_dynamic,
        reads_text=True,
    ),
    MechanismInfo(
        "composite",
        "dynamic + fixed lightweight convolution (composite attention, Eq. 6)",
        RadiusOptions,
        lambda s, o: _w(o) * (s.head_dim + s.num_heads),
        "(2r+1)·(d_h + H)",
        "posprobe.mechanisms.composite",
        "CompositeAttention",
        reading=R.read_composite,
        static_bias=True,
        reads_text=True,
    ),
    MechanismInfo(
        "key-dynamic",
        "key-based relative queries k_j . u[clip(i-j)] / sqrt(d_h)",
        RadiusOptions,
        lambda s, o: _w(o) * s.head_dim,
        "(2r+1)·d_h",
        "posprobe.mechanisms.dynamic",
        "KeyDynamicConvolution",
        reading=R.read_key_dynamic,
        reads_text=True,
    ),
    MechanismInfo(
        "shaw-values",
        "relative value embeddings a_V[clip(j-i)] weighted by attention (Shaw)",
        RadiusOptions,
        lambda s, o: _w(o) * s.head_dim,
        "(2r+1)·d_h",
        "posprobe.mechanisms.shaw_values",
        "ShawValues",
        reading=R.read_shaw_values,
        reads_text=True,
    ),
    MechanismInfo(
        "depthwise",
        "per-channel fixed convolution of the values beta[clip(j-i), c], added after softmax",
        RadiusOptions,
        lambda s, o: _w(o) * s.inner_size,
        "(2r+1)·d",
        "posprobe.mechanisms.depthwise",
        "DepthwiseConvolution",
        reading=R.read_depthwise,
    ),
    MechanismInfo(
        "conv-qkv",
        "depthwise-separable convolutions replace the Q/K/V projections of half the heads",
        RadiusOptions,
        lambda s, o: 3 * (s.input_size * _w(o) + _half(s) * s.input_size + _half(s)),
        "3·(d·(2r+1) + m·d + m), m = (H/2)·d_h",
        "posprobe.mechanisms.conv_qkv",
        "ConvolutionalQKV",
        reading=R.read_conv_qkv,
    ),
    MechanismInfo(
        "cat",
        "centred depthwise filters on the Q/K/V inputs (convolution-augmented attention, Dirac init)",
        RadiusOptions,
        lambda s, o: 3 * s.input_size * _w(o),
        "3·d·(2r+1)",
        "posprobe.mechanisms.cat",
        "ConvolutionAugmentedAttention",
        reading=R.read_cat,
    ),
]

CATALOGUE: dict[str, MechanismInfo] = {info.name: info for info in _ENTRIES}
MECHANISM_NAMES: tuple[str, ...] = tuple(CATALOGUE)


def mechanism_info(name) -> MechanismInfo:
    """The catalogue entry of `name`, or for a combination `a+b` (several mechanisms in one retrofit, e.g.
    `composite+key-dynamic`) a `CombinedInfo`; an unknown name is an `ArgumentValueError` naming `mechanism`."""
    if isinstance(name, str) and "+" in name:
        return combined_info(name)
    return CATALOGUE[as_choice(name, "mechanism", MECHANISM_NAMES)]


# ------------------------------------------------------------------------- combinations (one retrofit, parts)
@dataclass(frozen=True)
class CombinedOptions:
    """Options of a combination: its `parts` (catalogue names, in order) and the shared `kernels` / `radius`
    that each part takes what it uses from."""

    parts: tuple[str, ...] = ()
    kernels: int = DEFAULT_KERNELS
    radius: int = DEFAULT_RADIUS

    def __post_init__(self):
        object.__setattr__(self, "parts", tuple(self.parts))
        object.__setattr__(self, "kernels", check_kernels(self.kernels))
        object.__setattr__(self, "radius", check_radius(self.radius))

    def part_options(self, name: str) -> Options:
        return CATALOGUE[name].options(radius=self.radius, kernels=self.kernels)


@dataclass(frozen=True)
class CombinedInfo(MechanismInfo):
    """A combination of catalogue mechanisms: parameters and counts are the sum of its parts'."""

    parts: tuple[str, ...] = ()

    def options(self, **values) -> CombinedOptions:
        names = {"kernels", "radius"}
        return CombinedOptions(self.parts, **{k: v for k, v in values.items() if k in names and v is not None})


def combined_info(name: str) -> CombinedInfo:
    """`a+b[+c]` -> its `CombinedInfo`; each part must be a catalogue name, used once."""
    parts = tuple(as_choice(part, "mechanism", MECHANISM_NAMES) for part in name.split("+"))
    if len(set(parts)) != len(parts) or len(parts) < 2:
        raise ArgumentValueError(
            "mechanism",
            f"{{arg}} '{name}' repeats a part",
            "combine different mechanisms, e.g. {arg} composite+key-dynamic or {arg} fixed+shaw-values",
        )
    infos = [CATALOGUE[p] for p in parts]

    def count(shape: LayerShape, options: CombinedOptions) -> int:
        return sum(i.parameters_per_depth(shape, options.part_options(i.name)) for i in infos)

    return CombinedInfo(
        "+".join(parts),
        " + ".join(i.summary for i in infos),
        CombinedOptions,
        count,
        " + ".join(f"({i.formula})" if "+" in i.formula or "," in i.formula else i.formula for i in infos),
        "posprobe.mechanisms.combined",
        "CombinedMechanism",
        supports_fit=any(i.supports_fit for i in infos),
        static_bias=any(i.static_bias for i in infos),
        reads_text=any(i.reads_text for i in infos),
        window=max((i.window for i in infos if i.window is not None), default=None),
        parts=parts,
    )


def load_all() -> dict[str, type]:
    """Import every torch class (registering it); returns name -> class in catalogue order."""
    return {name: info.load() for name, info in CATALOGUE.items()}


# ------------------------------------------------------------------------------- one validation of a request
@dataclass(frozen=True)
class MechanismSettings:
    """A validated retrofit request: the mechanism, its options, the parsed init and (for ``fit:FILE``)
    the validated kernels file (`posprobe.formats.tisa_kernels.KernelsFile`)."""

    mechanism: str
    options: Options
    init: object  # posprobe.formats.tisa_kernels.InitSpec
    kernels_file: object | None = None

    @property
    def info(self) -> MechanismInfo:
        return mechanism_info(self.mechanism)

    @property
    def radius(self) -> int:
        return getattr(self.options, "radius", DEFAULT_RADIUS)

    @property
    def kernels(self) -> int:
        return getattr(self.options, "kernels", DEFAULT_KERNELS)


def check_settings(mechanism, *, radius=None, kernels=None, init="zero") -> MechanismSettings:
    """Validate (mechanism, radius, kernels, init) completely, before any model is loaded.

    radius / kernels: None = the default (8 / 5; with ``fit:FILE``, S is the file's). `kernels` set to a
    different S than a ``fit:FILE`` holds is refused. ``fit`` / ``fit:FILE`` apply to TISA only. Options a
    mechanism does not use are still checked (a bad value is a mistake either way) but otherwise ignored.
    Errors are `ArgumentError`s naming `mechanism`, `radius`, `kernels` or `init`, or `PosprobeError`s
    naming the kernels file.
    """
    from posprobe.errors import PosprobeError
    from posprobe.formats.tisa_kernels import absent_heads, parse_init, read_kernels_file

    info = mechanism_info(mechanism)
    if radius is not None:
        radius = check_radius(radius)
    if kernels is not None:
        kernels = check_kernels(kernels)
    spec = parse_init(init)
    kernels_file = None
    if spec.kind == "fit":
        if not info.supports_fit:
            raise ArgumentValueError(
                "init",
                f"{{arg}} {spec} only applies to TISA, not '{info.name}'",
                "use {arg} zero or {arg} random, or the mechanism tisa",
            )
        if spec.path is not None:
            kernels_file = read_kernels_file(spec.path)
            if absent_heads(kernels_file.a, kernels_file.b, kernels_file.c).any():
                raise PosprobeError(
                    f"'{spec.path}' was fitted to a model with a query-head count per layer (its layers' missing "
                    "heads have no kernels), which retrofit does not install into",
                    "use {arg} zero or {arg} random".replace("{arg}", "--init"),
                )
            if kernels is not None and kernels != kernels_file.n_kernels:
                raise ArgumentValueError(
                    "kernels",
                    f"{{arg}} {kernels} differs from the S = {kernels_file.n_kernels} kernels per head "
                    f"in '{spec.path}'",
                    "leave {arg} out (S comes from the file), or pass a file fitted with that S",
                )
            kernels = kernels_file.n_kernels
    options = info.options(radius=radius, kernels=kernels)
    return MechanismSettings(info.name, options, spec, kernels_file)


# -- what retrofit can install into, from a config alone ---------------------------------------------------------
CONFIG_KEY = "posprobe"  # the retrofit recipe's key in a checkpoint's config (config.json)


def retrofit_family(kind: str):
    """The family-table entry (`posprobe.architectures.table.Family`) of config `model_type` `kind` if retrofit can
    install into it; one clear error otherwise."""
    from posprobe.architectures.table import family_for_type, model_types
    from posprobe.errors import PosprobeError

    family = family_for_type(kind)
    if family is None or not family.retrofit:
        raise PosprobeError(
            f"cannot retrofit a '{kind}' model: only {', '.join(model_types(retrofit=True))} are supported",
            "use a BERT, RoBERTa, XLM-R, ALBERT or ELECTRA checkpoint",
        )
    return family


def check_retrofittable(config: dict) -> None:
    """Refuse, from a checkpoint's config alone (before any weights are read, without torch), a model retrofit
    cannot install into: a family it does not support, or one already retrofitted."""
    from posprobe.errors import PosprobeError

    retrofit_family(str(config.get("model_type", "unknown")))
    if config.get(CONFIG_KEY):
        raise PosprobeError("this model is already retrofitted", "start from the original checkpoint")
