"""Hardware target facts read by legality (frontend) and lowering (backend): targets, descriptors, hooks."""
