"""Measuring one candidate: compiling it ahead (compiling.py; compile_pool.py compiles the
queued ones in threads), timing it (timing.py: CUPTI, a profiler trace, the wall clock), the
answer it must give (oracle.py) and the tolerance it is held to (verify.py), the inputs it runs
on (inputs.py), re-measuring the fastest side by side (finalists.py), checking that it lowers
for a device this host lacks (lowering.py), and the policies a run sets (policies.py)."""
