"""zinf's Lightning strategy for scripts on the older ``pytorch_lightning`` package, whose
Trainer takes only its own Strategy classes: as zinf.lightning (the same names, the same
strategy, Note [Lightning on zinf] in zinf/_lightning_strategy.py), registered there.

    import pytorch_lightning as pl
    import zinf.pytorch_lightning                # registers "zinf", "zinf_stage_3_offload"
    trainer = pl.Trainer(strategy="zinf_stage_3_offload", accelerator="cpu")
"""

import pytorch_lightning as pl

from ._lightning_strategy import strategy_classes

__all__ = ["ZinfStrategy"]

ZinfStrategy, _ZinfPrecision = strategy_classes(pl, __name__)
