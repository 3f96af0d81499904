"""A dense layer's two orders of reading its weight: ``rows`` (the default: a block of outputs
accumulates while the weight's rows stream by) and ``columns`` (a register tile of outputs over
the whole reduction) compute the same product with every tile, on odd shapes and batches."""
import numpy as np
import pytest

import kernelrpc
from kernelrpc import nd
from kernelrpc.relay import strategy, tuning
from target_families import family_params



@pytest.mark.parametrize("target", family_params())
@pytest.mark.parametrize("batch, reduction, features", [(1, 512, 1000), (3, 37, 96), (2, 64, 4096),
                                                        (1, 7, 13)])
def test_every_configuration_computes_the_product(batch, reduction, features, target):
    task = tuning.task_of(("dense", [batch, reduction], [reduction, features], [], "float32",
                           str(target)), flop=1.0)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, reduction)).astype("float32")
    w = rng.standard_normal((reduction, features)).astype("float32")
    expect = task.reference(x, w)
    space = task.config_space
    orders = [e.val for e in space.space_map["order"].entities]
    assert orders == (["rows", "columns"] if strategy.dense_rows_block(
        strategy.tiles_for(target), features) else ["columns"])
    for index in range(len(space)):
        s, args = task.instantiate(space.get(index))
        lib = kernelrpc.build(s, args, target=target)
        out = nd.empty((batch, features), "float32")
        lib[lib.metadata["functions"][0]["name"]](nd.array(x), nd.array(w), out)
        np.testing.assert_allclose(out.numpy(), expect, rtol=1e-4, atol=1e-4,
                                   err_msg=str(space.get(index)))


@pytest.mark.parametrize("features, lanes, expect", [
    (4096, 16, (1024, 16)),        # four blocks of 1024
    (1000, 16, (200, 8)),          # not whole 16-lane vectors: 8 lanes, five blocks
    (96, 16, (96, 16)),            # one block: a quarter would hold fewer than 64
    (13, 16, None),                # no block of whole vectors
    (1000, 1, None),               # a scalar target
])
def test_the_rows_block(features, lanes, expect):
    tiles = strategy.Tiles(lanes, 4, 4, 16, 32)
    assert strategy.dense_rows_block(tiles, features) == expect
