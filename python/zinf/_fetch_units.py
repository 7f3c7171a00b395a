"""Which modules zinf.zero fetches as one unit with their descendants.

Note [Fetch units]
A fetch is a round trip through zinf.zero's hooks and the engine (tens of microseconds on the
host), where torch's forward of a small module takes a few; DeepSpeed and FSDP2 pay it once
per block, not per layer. So a subtree of small modules is one unit: one engine module holding
every parameter of the subtree, fetched in its root's forward pre-hook and released after the
root's forward, its descendants hooked no more (a read of one of their parameters from outside
the root's forward still fetches the unit, through the parameters' lookup: Note [Module
hooks]). Which subtrees, from zero_optimization.stage3_module_granularity_threshold:
- absent (zinf's default): a subtree whose parameters number fewer elements than
  stage3_param_persistence_threshold. Each of them is then persistent, gathered once a step
  and kept, so fetching them together holds no memory that fetching them one by one would not.
- above 0 (DeepSpeed's rule): a module whose granularity, its subtree's parameter elements
  over (1 + its number of descendants), is below the threshold.
- 0: no units, a fetch per module with parameters of its own (DeepSpeed's default).
The outermost module that qualifies is the unit's root. A module with no parameter in its
subtree is never a unit.
"""

KEY = "stage3_module_granularity_threshold"


def take_threshold(config):
    """Removes zero_optimization.stage3_module_granularity_threshold from `config` (a dict)
    and returns it: None when absent, else a number >= 0. ValueError naming the key for
    anything else."""
    zero = config.get("zero_optimization")
    if not isinstance(zero, dict) or KEY not in zero:
        return None
    value = zero.pop(KEY)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"zero_optimization.{KEY} must be a number of elements >= 0 (0: a "
                         f"fetch per module), got {value!r}")
    return value


def unit_roots(model, taken, threshold, persistence_threshold):
    """{id(module): root} for every module inside a unit (its root included), by Note [Fetch
    units]. `taken(p)`: whether zinf.zero manages parameter p. `threshold`: the config's
    stage3_module_granularity_threshold (None when absent)."""
    if threshold == 0 or (threshold is None and persistence_threshold == 0):
        return {}
    sizes = {}  # id(module) -> (elements of its subtree's parameters, descendants)

    def size(module):
        known = sizes.get(id(module))
        if known is None:
            # parameters() and modules() yield a shared one once.
            elements = sum(p.numel() for p in module.parameters() if taken(p))
            known = sizes[id(module)] = (elements, sum(1 for _ in module.modules()) - 1)
        return known

    def is_unit(module):
        elements, descendants = size(module)
        if elements == 0:
            return False
        if threshold is None:
            return elements < persistence_threshold
        return elements / (1 + descendants) < threshold

    roots = {}

    def visit(module):
        if id(module) in roots:
            return
        if is_unit(module):
            for inner in module.modules():
                roots.setdefault(id(inner), module)
            return
        for child in module.children():
            visit(child)

    visit(model)
    return roots
