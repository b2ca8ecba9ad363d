"""Checkpoints of other libraries in and out of lineax_lm: flash-linear-attention's (fla.py).

    model = lineax_lm.convert.from_fla("GatedDeltaNet-340M")   # or lineax_lm.from_pretrained(...)
    lineax_lm.convert.to_fla(model, "out")                     # or save_pretrained(..., format="fla")
    python -m lineax_lm.convert --from=fla --path=DIR --out=DIR  # an fla folder -> lineax_lm's layout
    python -m lineax_lm.convert --to=fla --path=DIR --out=DIR    # a lineax_lm folder -> fla's
"""
from lineax_lm.convert.fla import (FLA_MODEL_TYPES, config_from_fla, config_to_fla, fla_model_type,
                                   from_fla, load_fla, to_fla)

__all__ = ["FLA_MODEL_TYPES", "config_from_fla", "config_to_fla", "fla_model_type", "from_fla",
           "load_fla", "to_fla"]
