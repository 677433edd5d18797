"""The operator: watches -> work queue -> workers -> reconciler -> planner (docs/architecture.md).

`runtime/` is the generic controller runtime, `planner/` the pure decisions; the modules here wire
them to TrainingJobs: watches.py (what is watched, and which job an event wakes), resources.py (the
API resources used), reconciler.py and executor.py (the shell around the planner), manager.py
(start-up, leadership, workers), metrics.py (trainingjob_* series), cli.py (flags and signals).
"""
