"""The search strategies a tuning run can use, and the default. A module of its own so that the
CLI and job files can check a strategy name without importing Optuna."""

STRATEGIES = ("tpe", "gp", "cmaes", "random", "grid")

# "gp" finds a better configuration than "tpe" at every budget on the recorded GPU landscapes
# (benchmarks/README.md), and its proposal (tens of ms) is cheap against a compile and a timing
DEFAULT_STRATEGY = "gp"
