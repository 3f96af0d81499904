"""ONNX control flow whose decision is known at import: If with a condition that folds to a
constant (a branch on an input's shape, or on an input fixed with ``const_inputs=``) is
replaced by the nodes of the branch it takes."""
from __future__ import annotations

from ..errors import ModelError
from .onnx_common import converter


@converter("If")
def _if(ctx, args, attrs):
    cond = ctx.constant(args[0], "If's condition", "a condition known at import only: fix the "
                        "input it depends on with from_onnx(..., const_inputs={name: value}) "
                        "or --const NAME=VALUE")
    if cond.size != 1:
        raise ModelError(f"If's condition has {cond.size} elements, one expected")
    taken = attrs.get("then_branch" if bool(cond.reshape(())) else "else_branch")
    attrs.ignore("then_branch", "else_branch")
    outputs = ctx.convert_graph(taken)
    if len(outputs) != ctx.outputs_wanted:
        raise ModelError(f"the branch taken has {len(outputs)} outputs, the If node "
                         f"{ctx.outputs_wanted}")
    return outputs
