"""Contracts between the jobs: one module per boundary, one definition per field."""
