"""Serving tuned configurations to model code: the `@autotuned` decorator (decorator.py), the
lookup chain (lookup.py: overlays, the database, shipped tables, the nearest shape, defaults)
and its process state (state.py, settings.py), nearest shapes (nearest.py), overlays
(overlays.py), variant groups (variants.py), calls on sharded arrays (sharded.py), and reading
which calls a program makes (traced_calls.py, calls.py). Importing it loads neither Optuna nor
SQLAlchemy."""
