"""`make soak` (`python -m testbed.harness.soak`): the operator kept busy for a bounded time, its memory and
CPU sampled (docs/soak.md).

On a local cluster of its own (.dev/soak), a few hundred TrainingJobs stay in flight: every tick some
of their ranks fail (a gang restart), some jobs complete, completed jobs are deleted and new ones take
their place, so the operator sees create, fail, restart, complete and delete all the time while the
number of jobs it ever handled keeps growing. The operator's RSS and CPU seconds are sampled from /proc;
the run ends with one verdict line (did RSS level off?) and a JSON report with the time series.

- `analysis`: the level-off rule and the series' summary (pure);
- `churn`: the jobs kept in flight and what happens to them each tick;
- `run`: one run; `options`: flags and SOAK_* variables.
"""
