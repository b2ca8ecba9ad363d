"""The quickstart config, shipped inside the package as lineax_lm/configs/quickstart.py (so that a
pip-installed lineax_lm has it too); this file keeps `--config configs/quickstart.py:VARIANT`
working from a checkout."""
from lineax_lm.configs.quickstart import VARIANTS, get_config  # noqa: F401
