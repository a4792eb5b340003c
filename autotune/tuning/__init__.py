"""Tuning one task end to end: what it is (task.py: Task, bound to a device as a BoundTask),
how a run searches, measures and decides (settings.py: TuneSettings), what a task's tuning
runs with besides (context.py: TuneContext), the public entry (tune.py: tune, tune_task), one
kernel's search, finalists and store (kernel.py) or a variant group's (group.py), the workers
that measure (worker/), warm starts from stored entries (warmstart.py), the entry stored
(storing.py) and the result returned (result.py)."""
