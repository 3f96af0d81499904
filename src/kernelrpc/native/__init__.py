"""Host-side LLVM helpers of the compiler: LLVM's initialisation and the identity of the CPU
this process runs on.  This package imports neither the compiler nor numpy."""
