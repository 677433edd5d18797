"""A local kubelet for the dev cluster: runs TrainingJob pods' containers as local processes.

Why: the local control plane has no kubelet (kwok moves pods to Running and nothing ever runs), so
without this a TrainingJob never trains there: no progress, no checkpoints, no completion, no logs.
For the demo and for end-to-end tests of the whole loop (operator -> pods -> trainer -> progress
annotation -> status -> restart from the reported checkpoint, `kubectl logs`) this plays the part of
the kubelet for the pods the operator manages in the namespaces it is given (hack/README.md says
exactly what it does and does not do):

- it watches pods labelled app.kubernetes.io/managed-by=trainingjob-operator (the project's informer,
  admin kubeconfig); a pod that kwok marked Running is taken over once its gang is ready: a pod's
  process starts once every pod of its attempt is Running and no process of an older attempt of the
  job is still stopping;
- its containers run in the kubelet's order (init containers one by one, native sidecars kept
  running and stopped after the regular containers, the trainer and classic sidecars together), each
  under a shim that writes its log; a container runs if its command is `python SCRIPT` with the
  script in one of the pod's volumes (the reference trainer, or your code from a ConfigMap or a
  claim), and a trainer under torchrun too (loopback_torchrun.py: torchrun with its stores on
  127.0.0.1), else a sidecar or init container gets a stand-in and the trainer's pod is left alone;
  an elastic job's pods start one by one;
- the pod's volumes become local directories shared as in a cluster (a claim per claim, an emptyDir
  per pod, hostPath under the state directory), configMap, secret and projected contents written from
  the API, and every mount path in the environment, the command and the working directory is
  remapped;
- the environment is resolved as a kubelet does and handed over clean: of this process's environment
  only PATH and the locale, so no admin credentials reach a container; the trainer's progress goes to
  the real API server with the pod's own ServiceAccount token (minted bound to the pod, renewed);
- the trainer runs its pure-Python simulation (TRAIN_SIMULATE=1), MASTER_ADDR 127.0.0.1 and one free
  MASTER_PORT per job attempt; under torchrun it runs real torch, with its rendezvous on 127.0.0.1 and
  another free port per attempt, and Gloo on the loopback;
- the pod's status is reported as a kubelet reports it (phase, conditions, containerStatuses and
  initContainerStatuses) whenever it changes;
- it serves the kubelet API's container log endpoint on the port the nodes name in their status, over
  TLS with the cluster's PKI, so `kubectl logs` and the Python client read the containers' output;
- a pod that is deleted gets SIGTERM, then SIGKILL after its grace period. When this process stops it
  stops its containers and ends their pods with DisruptionTarget TerminationByKubelet (a node
  shutdown); pods it ran before a crash are ended the same way when it starts again
  (ContainerStatusUnknown), so the operator restarts the gang from its last checkpoint.

This process logs plain lines to stderr. It never exits because of a pod: anything odd is logged and
the pod skipped.

    .venv/bin/python -m hack.local_kubelet --namespace demo [--namespace other ...]

Its modules, by concern: pods (what a Pod says), env (the environment a kubelet computes, made
local), volumes (volumes as local directories, tokens), launch (from a pod to its containers' command
lines), containers (the kubelet's rules for a pod's containers and the status it reports), processes
(the container processes and their records), shim (one container's process and log writer),
loopback_torchrun (torchrun with every store it starts on 127.0.0.1), logfiles (container logs on
disk, read back as the kubelet API serves them), logserver (that API's log endpoint), status (reports
to the API server), kubelet (the loop), __main__.
"""
