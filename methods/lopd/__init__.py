"""LOPD (latent on-policy self-distillation) and its parts.

* :mod:`.margin`    -- the privileged-margin objective, pure functions (M1-M5);
* :mod:`.composer`  -- LoRA + Q-Former composer and the latent-conditioned frozen teacher;
* :mod:`.coldstart` -- the composer's cold start (its own pipeline rule);
* :mod:`.method`    -- the method registered as ``lopd`` (its ablations are config variants).
"""

from .method import LOPD, LOPDConfig

__all__ = ["LOPD", "LOPDConfig"]
