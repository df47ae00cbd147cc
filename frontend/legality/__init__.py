"""Target-aware legality checks run on the typed, laid-out IR before lowering."""
