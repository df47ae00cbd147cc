"""The tile IR: ops, values, types, the printer, the verifier and the axis analysis."""
