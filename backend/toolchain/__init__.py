"""LLVM IR to PTX (llvmlite) and PTX to cubin (nvJitLink)."""
