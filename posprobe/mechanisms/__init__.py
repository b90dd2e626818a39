"""Positional mechanisms that can be retrofitted into pretrained attention layers.

`REGISTRY` maps a mechanism name to its class (a `PositionalMechanism` subclass); adding a module with a
`@register`-decorated class and importing it here makes it available to `retrofit`, the CLI and the tests.
"""

from posprobe.mechanisms import cat, composite, conv_qkv, depthwise, dynamic, fixed, shaw_values, tisa  # noqa: F401  (registration)
from posprobe.mechanisms.base import (
    REGISTRY,
    ROLES,
    LayerShape,
    PositionalMechanism,
    clipped_index,
    get_mechanism,
    offset_range,
    offsets,
    register,
    relative_to_absolute,
    toeplitz,
)
from posprobe.mechanisms.tisa import tisa_profile

__all__ = [
    "REGISTRY",
    "ROLES",
    "LayerShape",
    "PositionalMechanism",
    "clipped_index",
    "get_mechanism",
    "offset_range",
    "offsets",
    "toeplitz",
    "register",
    "relative_to_absolute",
    "tisa_profile",
]
