"""TVM's graph JSON (the graph executor's format) for a partitioned network."""
from __future__ import annotations

import json


def graph_json(func, groups, kernel_names: list, plan) -> str:
    nodes, entry, arg_nodes = [], {}, []
    shapes, dtypes, storage = [], [], []
    storage_ids: dict = {}

    def storage_of(node):
        loc = plan.locations[id(node)]
        return storage_ids.setdefault((loc.kind, loc.index), len(storage_ids))

    def add_var(node, name):
        entry[id(node)] = len(nodes)
        arg_nodes.append(len(nodes))
        nodes.append({"op": "null", "name": name, "inputs": []})
        shapes.append(list(node.shape))
        dtypes.append(node.dtype)
        storage.append(storage_of(node))
    for node in func.inputs:
        add_var(node, node.name)
    for k, node in enumerate(plan.params):
        add_var(node, f"p{k}")
    names = set()
    for group, func_name in zip(groups, kernel_names):
        inputs = [[entry[id(i)], 0, 0] for i in group.inputs()]
        entry[id(group.output)] = len(nodes)
        name = group.name
        if name in names:                  # a node name once: TVM's tools key layers by it
            name = f"{name}_{len(nodes)}"
        names.add(name)
        nodes.append({"op": "tvm_op", "name": name, "inputs": inputs,
                      "attrs": {"func_name": func_name, "num_inputs": str(len(inputs)),
                                "num_outputs": "1", "flatten_data": "0"}})
        shapes.append(list(group.output.shape))
        dtypes.append(group.output.dtype)
        storage.append(storage_of(group.output))
    return json.dumps({
        "nodes": nodes, "arg_nodes": arg_nodes,
        "heads": [[entry[id(o)], 0, 0] for o in func.outputs],
        "attrs": {"dltype": ["list_str", dtypes], "shape": ["list_shape", shapes],
                  "storage_id": ["list_int", storage]},
        "node_row_ptr": list(range(len(nodes) + 1)),
    }, indent=None)
