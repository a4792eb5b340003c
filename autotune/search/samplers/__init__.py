"""The model-based samplers: a base class (base.py) and one model per module."""
