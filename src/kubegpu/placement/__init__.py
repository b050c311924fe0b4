"""Placement engine: pure cluster state, requests, feasibility, scoring and GPU choice."""
