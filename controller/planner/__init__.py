"""The planner: what a TrainingJob needs next, decided without I/O.

`plan(Observed, Settings) -> Plan` (plan.py) is the whole interface: the reconciler observes, plans,
writes, and plans again with the create failures when the cluster refused an object. Inside, in the
order a reader follows one job:

- model.py: what goes in (`Observed`, `Settings`, `CreateFailure`) and what comes out (`Plan`);
- facts.py: the observation read once per reconcile (the typed spec, the pods seen as a `Gang`);
- decide.py: the state machine, as the order of checks that returns the next `Decision`;
- transitions.py: one pure function per decision, applied to the status;
- timers.py: time arithmetic that cannot overflow, and when to look at the job again;
- gang.py, podstate.py, failures.py, progress.py, conditions.py, supporting.py, texts.py: the
  questions decisions ask (of pods, of failures, of progress reports), the conditions they keep, the
  supporting objects they compare, and the texts they write.
"""

from controller.planner.model import CreateFailure, Delete, Event, Observed, Plan, Settings
from controller.planner.plan import plan
from controller.planner.texts import format_duration

__all__ = ["CreateFailure", "Delete", "Event", "Observed", "Plan", "Settings", "format_duration", "plan"]
