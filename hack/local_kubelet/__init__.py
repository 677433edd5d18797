"""A local kubelet for the dev cluster: runs TrainingJob pods' reference trainer as local processes.

Why: the local control plane has no kubelet (kwok moves pods to Running and nothing ever runs), so
without this a TrainingJob never trains there: no progress, no checkpoints, no completion. For the
demo and for end-to-end tests of the whole loop (operator -> pods -> trainer -> progress annotation ->
status -> restart from the reported checkpoint) this plays the part of the kubelet for the pods the
operator manages in the namespaces it is given:

- it watches pods labelled app.kubernetes.io/managed-by=trainingjob-operator (the project's informer,
  admin kubeconfig); a pod that kwok marked Running is started once as a local process;
- the pod's volumes become local directories under <state-dir>/<ns>/<job>/: the job's ConfigMap
  (train.py, trainingjob_progress.py, config.json) is `config/`, the checkpoint volume `checkpoints/`,
  other configMap, secret and storage volumes `volumes/<name>/`, and the pod's own (emptyDir, the
  projected service-account volume) `pods/<pod>/<name>/`; configMap, secret and projected contents
  are written from the API. Every mount path is remapped in the environment (CHECKPOINT_DIR,
  RESUME_FROM, TRAININGJOB_CONFIG, ...) and in the trainer's arguments;
- the environment is resolved as a kubelet does (values with $(VAR) expansion, fieldRef,
  secretKeyRef / configMapKeyRef and envFrom through the API; what cannot be resolved is skipped with a
  log line) and handed over clean: of this process's environment only PATH and the locale, so no
  admin credentials reach the trainer;
- progress goes to the real API server with the pod's own ServiceAccount token: the projected token is
  minted with a TokenRequest bound to the pod, as a kubelet does, and renewed before it expires; the
  progress helper finds it, the projected CA and the API server's address through
  TRAININGJOB_PROGRESS_TOKEN_FILE / _CA_FILE / _API_URL (the in-pod path cannot be remapped);
- only the reference trainer runs (`python /etc/trainingjob/train.py`, started with this interpreter);
  other commands are logged and their pods left Running. The trainer runs its pure-Python simulation
  (TRAIN_SIMULATE=1): ranks exchange nothing, so nothing listens on any port, it needs no torch (the
  demo's virtualenv has none) and an epoch takes as long as TRAIN_STEP_SECONDS says. Real
  torch.distributed with the operator's environment is covered by tests/trainer/test_real_training.py.
  MASTER_ADDR is 127.0.0.1 and MASTER_PORT one free port per job attempt, the same for every rank;
- the gang starts together, as a rendezvous would hold it: a pod's process starts once every pod of
  its attempt is Running and no process of an older attempt of the job is still stopping;
- when a process exits, the pod's status is patched as a kubelet reports it (hack/podstatus.py: phase,
  the container's terminated state with exit code and reason, the log's tail as message on failure);
- a pod that is deleted (gang restart, suspend, clean-up) gets SIGTERM, then SIGKILL after its grace
  period. When this process stops it stops its trainers and ends their pods with DisruptionTarget
  TerminationByKubelet (a node shutdown); pods it ran before a crash are ended the same way when it
  starts again (ContainerStatusUnknown), so the operator restarts the gang from its last checkpoint.

Each pod's output goes to <log-dir>/<ns>_<pod>.log (appended across attempts). This process logs plain
lines to stderr. It never exits because of a pod: anything odd is logged and the pod skipped.

    .venv/bin/python -m hack.local_kubelet --namespace demo [--namespace other ...]

Its modules, by concern: pods (what a Pod says: running, job, attempt, gang, grace period, command),
env (the environment a kubelet computes, made local), volumes (volumes as local directories, tokens),
launch (from a pod to the trainer's command line), processes (the trainer processes, their logs and
records), status (a container's end reported in the Pod's status), kubelet (the loop), __main__.
"""
