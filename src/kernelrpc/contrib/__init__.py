"""TVM's ``tvm.contrib`` helpers for building and saving modules: :mod:`.cc`, :mod:`.utils`."""
