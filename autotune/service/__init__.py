"""Running many tuning tasks: what `autotune tune` asks, decided and run in one call (run.py),
jobs (jobs.py: sharded across machines, each task in turn or side by side on several
devices), job files (jobfile.py), recorded misses (pending.py) and a watcher that tunes them as
they come (watch.py, with claims.py so that two watchers never tune one key), every call of a
program (program.py), and the progress shown (progress.py)."""
