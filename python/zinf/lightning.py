"""Lightning on zinf: a ``Strategy`` registered by name, as Lightning's DeepSpeed strategies are.

    import zinf.lightning                       # registers the names below
    trainer = lightning.pytorch.Trainer(strategy="zinf_stage_3_offload", accelerator="cpu")
    trainer = lightning.pytorch.Trainer(strategy=zinf.lightning.ZinfStrategy(config="ds.json"))

Names: "zinf" (stage 3, everything in memory), "zinf_stage_3_offload" (parameters and optimizer
on the CPU), and ``ZinfStrategy(config=...)`` for any DeepSpeed JSON config (NVMe offload
included). Processes come from the launcher (``zinf run -n N``, torchrun) or from Lightning's.

The strategy is built in zinf/_lightning_strategy.py (Note [Lightning on zinf]); for scripts that
import the older ``pytorch_lightning`` package, ``import zinf.pytorch_lightning`` registers the
same names there.
"""

import lightning.pytorch as pl

from ._lightning_strategy import strategy_classes

__all__ = ["ZinfStrategy"]

ZinfStrategy, _ZinfPrecision = strategy_classes(pl, __name__)
