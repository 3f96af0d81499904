"""The session protocol's name and version (what the hello and the tracker's ``-protocol=`` carry).

Apart from protocol.py so that the tracker client can name it without loading the codec.
"""
PROTOCOL_NAME = "kernelrpc"
PROTOCOL_VERSION = 1
VERSION_STRING = f"{PROTOCOL_NAME}/{PROTOCOL_VERSION}"
