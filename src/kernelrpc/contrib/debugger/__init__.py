"""TVM's ``tvm.contrib.debugger``: the per-layer profile of a network (:mod:`.debug_executor`)."""
