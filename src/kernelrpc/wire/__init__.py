"""The wire: every byte format kernelrpc's client, server, tracker and proxy exchange, and
nothing that speaks it. The session protocol's frames (:mod:`.protocol`), its requests
(:mod:`.requests`) and values (:mod:`.values`), the packed time_evaluator result
(:mod:`.profile`), the framed socket (:mod:`.transport`), tensor conversion (:mod:`.convert`),
the opening of a connection (:mod:`.handshake`, :mod:`.tls`, :mod:`.auth`), the tracker's frames
(:mod:`.tracker_codec`), the registration machine (:mod:`.registration`, with :mod:`.backoff`),
the proxy's device records (:mod:`.device_record`) and the version (:mod:`.version`).

The wire imports no service (server/, tracker/, proxy/) and not the client (rpc/): they all
import it (tests/test_import_rules.py checks). Importing the package loads nothing else."""
