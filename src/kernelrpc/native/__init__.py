"""Host-side native code helpers shared by the compiler and the proxy.

LLVM's initialisation, the identity of the CPU this process runs on, JIT
compilation of an ``llvmlite.ir`` module for it, and the spin-wait hint.  This
package imports neither the compiler nor numpy, so a proxy that JIT-compiles
its relay loop stays a small process.
"""
