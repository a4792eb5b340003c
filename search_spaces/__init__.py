"""Search spaces of the shipped kernels, one TOML file per kernel (data only)."""
