{{/*
Names. Every object is named after the release's full name: the release name when it contains the
chart's name (`helm install trainingjob-operator ...` gives the names deploy/ uses), else
"<release>-trainingjob-operator"; fullnameOverride replaces both. At most 55 characters, so the metrics
Service's "-metrics" still fits a DNS label.
*/}}
{{- define "trainingjob-operator.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 55 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 55 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "trainingjob-operator.metricsServiceName" -}}
{{- include "trainingjob-operator.fullname" . }}-metrics
{{- end -}}

{{/*
Labels: the application's own (as deploy/ sets them) and Helm's bookkeeping of the release. The
selectors add the release (app.kubernetes.io/instance), so two releases never select each other's pods.
*/}}
{{- define "trainingjob-operator.labels" -}}
app.kubernetes.io/name: trainingjob-operator
app.kubernetes.io/part-of: trainingjob-operator
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "trainingjob-operator.selectorLabels" -}}
app.kubernetes.io/name: trainingjob-operator
app.kubernetes.io/component: controller
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/*
The rights the operator needs wherever TrainingJobs live: the ClusterRole's rules, or in
single-namespace mode the Role's in the watched namespace. Exactly the operator's API calls; no
wildcards, no Secrets (pods only name Secrets in their env, which the kubelet resolves).
*/}}
{{- define "trainingjob-operator.namespacedRules" -}}
# Watch TrainingJobs; delete finished ones whose ttlSecondsAfterFinished has passed.
- apiGroups: ["ml.example.com"]
  resources: ["trainingjobs"]
  verbs: ["get", "list", "watch", "delete"]
- apiGroups: ["ml.example.com"]
  resources: ["trainingjobs/status"]
  verbs: ["get", "patch"]
# ownerReferences with blockOwnerDeletion on the job's children need update on the owner's
# finalizers subresource where OwnerReferencesPermissionEnforcement is on.
- apiGroups: ["ml.example.com"]
  resources: ["trainingjobs/finalizers"]
  verbs: ["update"]
# The jobs' pods and Services and the trainer's sources (ConfigMaps). RBAC cannot limit these to the
# objects the operator labels; the admission policy operator-writes-policy.yaml does, and keeps the
# operator out of the system namespaces. patch on pods: the tracking finalizer.
- apiGroups: [""]
  resources: ["pods", "services", "configmaps"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# Checkpoint volumes; never deleted by the operator (no delete). patch: the job's owner reference
# is taken off a claim that must outlive the job (checkpoint.storage.pvc.create.whenDeleted Retain).
- apiGroups: [""]
  resources: ["persistentvolumeclaims"]
  verbs: ["get", "list", "watch", "create", "patch"]
# An MPI job's SSH key (<job>-mpi-ssh): created only, deleted with the job, never read.
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create", "patch"]
# The namespace's trainer account and the RoleBinding that grants it the ClusterRole trainingjob-trainer,
# each named trainingjob-trainer: `create` cannot be limited by name, the rest can (list and watch
# with a field selector on the name). No rights on Roles at all.
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  resourceNames: ["trainingjob-trainer"]
  verbs: ["get", "list", "watch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["create"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  resourceNames: ["trainingjob-trainer"]
  verbs: ["get", "list", "watch", "patch", "delete"]
# `bind` on that one ClusterRole: the operator may grant it, and nothing else.
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["clusterroles"]
  resourceNames: ["trainingjob-trainer"]
  verbs: ["bind"]
# Gang scheduling with the scheduler-plugins coscheduler or Volcano.
- apiGroups: ["scheduling.x-k8s.io", "scheduling.volcano.sh"]
  resources: ["podgroups"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
# Kueue (docs/shared-clusters.md): a queued job's Workload; its status to mark it finished and to
# release an eviction's quota once the pods are gone.
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads"]
  verbs: ["get", "list", "watch", "create", "delete", "patch"]
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["workloads/status"]
  verbs: ["patch"]
{{- end -}}

{{/*
Cluster-scoped reads: which nodes exist and what they can hold (GPUs), to explain unschedulable jobs;
Kueue's ResourceFlavors and the priority classes of queued jobs; Volcano's Queues (a job's pods wait
while its queue is missing or closed); by name, the admission policies that
bound what the operator hands out (the trainers' rights, the pods of jobs asking for more than a
tenant's), watched for as long as the operator runs.
*/}}
{{- define "trainingjob-operator.clusterReadRules" -}}
- apiGroups: [""]
  resources: ["nodes"]
  verbs: ["get", "list", "watch"]
# Kueue's objects a Workload's placement and priority are read from, and MultiKueue's worker clusters
# (whether a dispatched job's worker is reachable) (docs/shared-clusters.md).
- apiGroups: ["kueue.x-k8s.io"]
  resources: ["resourceflavors", "workloadpriorityclasses", "multikueueclusters"]
  verbs: ["get", "list", "watch"]
# Volcano's Queues: a job's pods wait while its queue is missing or closed (docs/shared-clusters.md).
- apiGroups: ["scheduling.volcano.sh"]
  resources: ["queues"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["scheduling.k8s.io"]
  resources: ["priorityclasses"]
  verbs: ["get", "list", "watch"]
- apiGroups: ["admissionregistration.k8s.io"]
  resources: ["validatingadmissionpolicies", "validatingadmissionpolicybindings"]
  resourceNames: ["trainingjob-trainer-progress", "trainingjob-escalation"]
  verbs: ["list", "watch"]
{{- end -}}

{{/*
Seconds in a Go duration ("1h30m", "500ms"; values.schema.json admits nothing else), for the checks
between flags below.
*/}}
{{- define "trainingjob-operator.seconds" -}}
{{- $units := dict "ns" 0.000000001 "us" 0.000001 "µs" 0.000001 "ms" 0.001 "s" 1.0 "m" 60.0 "h" 3600.0 -}}
{{- $total := 0.0 -}}
{{- range regexFindAll "[0-9.]+(ns|us|µs|ms|s|m|h)" . -1 -}}
{{- $unit := regexFind "(ns|us|µs|ms|s|m|h)$" . -}}
{{- $total = addf $total (mulf (trimSuffix $unit . | float64) (get $units $unit)) -}}
{{- end -}}
{{- $total -}}
{{- end -}}

{{/*
What values.schema.json cannot express, refused with the value's name before anything is applied:
the operator's own checks between its leader election flags (client-go's rules; the operator makes
them at start whether or not it elects), and more than one replica without leader election (every
replica would reconcile the same jobs).
*/}}
{{- define "trainingjob-operator.validate" -}}
{{- $operator := .Values.operator -}}
{{- $lease := include "trainingjob-operator.seconds" $operator.leaseDuration | float64 -}}
{{- $renew := include "trainingjob-operator.seconds" $operator.renewDeadline | float64 -}}
{{- $retry := include "trainingjob-operator.seconds" $operator.retryPeriod | float64 -}}
{{- if not (gt $retry 0.0) -}}
{{- fail (printf "operator.retryPeriod (%s) must be more than 0" $operator.retryPeriod) -}}
{{- end -}}
{{- if not (gt $lease $renew) -}}
{{- fail (printf "operator.leaseDuration (%s) must be longer than operator.renewDeadline (%s)" $operator.leaseDuration $operator.renewDeadline) -}}
{{- end -}}
{{- if not (gt $renew (mulf 1.2 $retry)) -}}
{{- fail (printf "operator.renewDeadline (%s) must be longer than 1.2 x operator.retryPeriod (%s)" $operator.renewDeadline $operator.retryPeriod) -}}
{{- end -}}
{{- if and (not $operator.leaderElect) (gt (int .Values.replicas) 1) -}}
{{- fail (printf "replicas (%d) must be 0 or 1 when operator.leaderElect is false: every replica would reconcile the same TrainingJobs" (int .Values.replicas)) -}}
{{- end -}}
{{- end -}}
