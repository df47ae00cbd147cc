"""Layouts: the linear-layout algebra, the named library, shared-memory layouts and layout inference."""
