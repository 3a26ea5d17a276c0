"""Cost models for the simulated executor: the duration of one step from its shape (testbed.sim.shape).

A registry: name -> "module:Class", imported on demand; a name may also be the import path of the user's
own CostModel subclass (testbed.plugins). replay_steps is no model: the clock replays a recorded run.
"""

from testbed.plugins import check_options, is_import_path, load_class
from testbed.sim.cost_models.base import CostContext, CostModel

COST_MODELS = {
    "roofline": "testbed.sim.cost_models.roofline:RooflineCost",
    "profile": "testbed.sim.cost_models.profile:ProfileCost",
    "operators": "testbed.sim.cost_models.operators:OperatorCost",
}
REPLAY_STEPS = "replay_steps"
NAMES = (*COST_MODELS, REPLAY_STEPS)


def cost_model_class(name: str, options: dict | None = None) -> type[CostModel]:
    """The class registered as `name` or at the import path `name`; its options checked unless None."""
    if name not in COST_MODELS and not is_import_path(name):
        raise ValueError(
            f"unknown sim cost_model {name!r}; choose one of {list(NAMES)} or give an import path module:Class"
        )
    cls = load_class("sim cost_model", COST_MODELS, name, CostModel)
    if options is not None:
        check_options("sim cost_model", name, cls.options_target(), options, fixed=("ctx",))
    return cls


def build_cost_model(name: str, ctx: CostContext, options: dict | None = None) -> CostModel:
    return cost_model_class(name, options or {}).build(ctx, **(options or {}))


__all__ = ["COST_MODELS", "NAMES", "REPLAY_STEPS", "CostContext", "CostModel", "build_cost_model", "cost_model_class"]
