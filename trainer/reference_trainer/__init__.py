"""The reference trainer: what a TrainingJob runs when spec.command is not set.

Why it exists: it shows, in one small package, everything the operator expects of training code
(docs/env.md, docs/progress.md) and lets a job be tried without writing any: it joins the job's
torch.distributed rendezvous from the injected environment, trains a small classifier on synthetic
data with gradients all-reduced across every process (DistributedDataParallel), reports progress from
rank 0, writes a checkpoint every CHECKPOINT_FREQUENCY epochs and after the last one (keeping
CHECKPOINT_RETENTION of them) and, after a restart, continues from RESUME_FROM instead of starting over.
In an elastic job (TRAININGJOB_MAX_WORKERS is set; torchrun starts the processes) it continues from the
newest checkpoint under CHECKPOINT_DIR instead: torchrun starts the processes of a pod again after every
change of the world, and the pod's RESUME_FROM is only as recent as the pod.

The operator ships it in the namespace's trainer ConfigMap with the progress helper's package
(trainingjob_progress), both mounted at /etc/trainingjob beside the entry script the default command
runs (train.py, which puts the mount on sys.path and calls `main.main`). Its modules: config (the
environment read into a Config), checkpoints, engines and torch_engine (the simulation and torch), loop
(the epochs), launch (one process per local rank) and main (logging, signals, exit status and the
termination message). This file imports none of them: importing the package costs nothing.

- torch importable: real training. Backend from TORCH_DISTRIBUTED_BACKEND (default gloo;
  nccl falls back to gloo without a GPU), init_method env:// (MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
  RANK). With LOCAL_WORLD_SIZE > 1 and no launcher (torchrun sets LOCAL_RANK) it starts one process per
  local rank itself, with RANK = RANK + local rank.
- The job's hyperparameters: EPOCHS, BATCH_SIZE (per micro-batch), LEARNING_RATE, OPTIMIZER (sgd with
  momentum 0.9, adam, adamw, rmsprop), WARMUP_STEPS (the learning rate rises linearly over the first
  optimizer steps), GRADIENT_ACCUMULATION_STEPS (micro-batches per optimizer step; a step of
  TRAIN_STEPS_PER_EPOCH is an optimizer step), MIXED_PRECISION (autocast: bfloat16 on the CPU, float16
  with loss scaling on a GPU; the simulation ignores it), and from additionalParams HP_WEIGHT_DECAY and
  HP_LABEL_SMOOTHING. One line of its log names them all ("training with optimizer adamw, ..."). It
  reads no other HP_<KEY> variable.
- torch not installed (e.g. the jax default image): a pure-Python simulation of the same loop
  (logistic regression, no gradient exchange between ranks) so the job still trains, checkpoints,
  resumes and reports progress. It says so in its log. torch installed but failing to load is a
  failed run (retried like any other), never the simulation.

Knobs besides the operator's variables (set them in spec.env): TRAIN_STEPS_PER_EPOCH (20),
TRAIN_STEP_SECONDS (0: extra time per step, to watch progress in a demo), TRAIN_SAVE_SECONDS (0: extra
time each checkpoint takes to write, to see a save outlast the grace period), TRAIN_SEED (0),
TRAIN_FAIL_AT_EPOCH (exit 1 right after completing that epoch, unless this run resumed past it: tests
restarts), TRAIN_FAIL_FILE (a path: when it appears, the rank removes it and exits 1 after its current
step; the recovery bench fails a rank mid-epoch with it), TRAIN_SIMULATE=1 (the simulation even with
torch), TRAIN_PROGRESS_INTERVAL (seconds between progress reports, default 5), TRAIN_DIST_TIMEOUT
(seconds to wait for peers, default 1800).

SIGTERM (the pod is being deleted: docs/progress.md, "When the pod is told to stop"): before training
starts, the run ends at once; while it trains, every rank finishes the step it is in, they agree on it,
rank 0 saves a checkpoint of that step (epoch-<E>-step-<S>) and reports it, and every rank exits 143.
The next attempt resumes at that step.

Standard library besides torch, Python 3.9 or later. Exit status: 0 done, 1 training failed, 2 bad
configuration, 143 terminated (SIGTERM).
"""
