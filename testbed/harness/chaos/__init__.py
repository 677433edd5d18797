"""`make chaos` (`python -m testbed.harness.chaos`): the operator under disturbance, audited (docs/chaos.md).

On a local cluster of its own (.dev/chaos): many TrainingJobs, two operator replicas under one Lease,
and rounds that each kill or stop the leader, restart the API server or lose a node, and inject faults
into jobs at the same moment (failures, preemptions with and without delete, force deletes, deletions of
restarting jobs). After every round it waits until each job shows the restarts its faults must cost;
at the end it completes and deletes every job, and audits: accounting, restartCount, convergence,
orphans, held pods, and that no two replicas ever wrote at once. One summary line, a JSON report in
.dev/chaos/chaos-report.json, exit code 0 only when every invariant held.

- `plan`: the seeded rounds and the ledger of what each job's status must say (pure);
- `audit`: the invariants over what the run recorded (pure);
- `cluster`: the jobs, the faults, a node's loss, and the observer;
- `replicas`: the two operator processes, the leader, handovers, and their logs;
- `run`: one run; `options`: flags and CHAOS_* variables.
"""
