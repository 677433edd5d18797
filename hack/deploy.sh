#!/usr/bin/env bash
# Installs or removes the operator in the cluster $KUBECONFIG points at (make deploy / make undeploy).
#
#   hack/deploy.sh apply|delete|render   OVERLAY=monitoring|network-policy|single-namespace  IMG=<ref>
#                                        NODE_SELECTOR=key=value,...  TOLERATE=key=value:Effect,...
#                                        IMAGE_PULL_SECRETS=name,...
#                                        API_SERVER_ADDRESSES=ip[/prefix],...  API_SERVER_PORTS=port,...
#
# Why a script: before touching the cluster it checks that kubectl exists and the cluster answers,
# renders the kustomization (with IMG, NODE_SELECTOR and TOLERATE, if given) and validates every
# object with a server-side dry run, so a mistake is reported with nothing half-installed. `delete`
# keeps crd/'s objects, the CRD (deleting it deletes every TrainingJob) and the admission policies,
# unless DELETE_CRD=1, which deletes the jobs first, while the operator still runs to let
# their pods go. `render` prints what `apply` would send, without a cluster.
#
# NODE_SELECTOR and TOLERATE place the operator's pods on a dedicated, tainted node pool:
# NODE_SELECTOR adds node labels to the pods' nodeSelector (beside kubernetes.io/os: linux), TOLERATE
# lists taints the pods tolerate as `kubectl taint` writes them: key=value:Effect, key:Effect (any
# value), key=value (any effect), key (any value, any effect).
#
# IMAGE_PULL_SECRETS names Secrets of type kubernetes.io/dockerconfigjson in the operator's namespace
# (trainingjob-system) that the kubelet pulls IMG with, for an image in a registry that asks for
# credentials: the pods' imagePullSecrets, as the Helm chart's `imagePullSecrets` value sets them.
#
# OVERLAY=network-policy: the NetworkPolicy's first egress rule must name the API server's endpoints
# (no selector can: the API server is no pod), and as shipped it names no address. They are filled in
# from API_SERVER_ADDRESSES and API_SERVER_PORTS, or, for what these leave unset, read from the
# `kubernetes` Service's EndpointSlices in `default`. Without an address the script stops, with
# nothing applied: a rule without a destination would let the operator reach any host.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ACTION=${1:-}
OVERLAY=${OVERLAY:-}
# IMG is the operator's image, as kubebuilder's Makefiles name it (`make docker-build docker-push
# deploy IMG=...`); IMAGE, its earlier name here, still works.
IMAGE=${IMG:-${IMAGE:-}}
IMAGE_PULL_SECRETS=${IMAGE_PULL_SECRETS:-}
NODE_SELECTOR=${NODE_SELECTOR:-}
TOLERATE=${TOLERATE:-}
API_SERVER_ADDRESSES=${API_SERVER_ADDRESSES:-}
API_SERVER_PORTS=${API_SERVER_PORTS:-}
KUBECTL=${KUBECTL:-kubectl}
DEV=${TJ_DEV_DIR:-$REPO/.dev}
[[ -x "$DEV/bin/kubectl" && "$KUBECTL" == kubectl ]] && KUBECTL="$DEV/bin/kubectl"

fail() { echo "deploy: $*" >&2; exit 1; }

case "$ACTION" in apply | delete | render) ;; *) fail "usage: hack/deploy.sh apply|delete|render" ;; esac
command -v "$KUBECTL" >/dev/null 2>&1 ||
  fail "kubectl not found. 'make dev-cluster' builds one (.dev/bin/kubectl), or install kubectl 1.34+."
if [[ "$ACTION" != render ]] && ! "$KUBECTL" version --request-timeout=5s >/dev/null 2>&1; then
  fail "no reachable cluster (KUBECONFIG=${KUBECONFIG:-~/.kube/config}). Point KUBECONFIG at a cluster," \
    "or start the local one: make dev-cluster && eval \"\$(hack/dev-cluster.sh env)\""
fi
source_dir=deploy
if [[ -n "$OVERLAY" ]]; then
  source_dir=deploy/overlays/$OVERLAY
  [[ -d "$REPO/$source_dir" ]] || fail "no overlay '$OVERLAY'; one of: $(ls "$REPO/deploy/overlays" | tr '\n' ' ')"
fi

# The local cluster (hack/dev-cluster.sh, testbed/): its kwok nodes run no container, so the operator's
# pods would show Running there while nothing runs. When it has its real node and no placement is
# given, the operator goes on the real node; without an image given, the one this tree builds, which
# hack/dev-cluster.sh gives the node (built the first time). The demo's operator, a process of the
# same cluster, is stopped: one operator reconciles the jobs. Without a real node, it says so.
if [[ "$ACTION" == apply ]] && [[ -n "$("$KUBECTL" get nodes -l kwok.x-k8s.io/managed=true -o name 2>/dev/null)" ]]; then
  real_node=$("$KUBECTL" get nodes -l ml.example.com/real-node=true -o name 2>/dev/null)
  if [[ -z "$real_node" ]]; then
    echo "deploy: warning: this cluster's nodes are kwok's, which run no container: the operator's pods will show" \
      "Running and run nothing. Add a real node (hack/dev-cluster.sh up --with real-node) or run it from source (make run)" >&2
  elif [[ -z "$NODE_SELECTOR$TOLERATE" ]]; then
    NODE_SELECTOR=ml.example.com/real-node=true TOLERATE=ml.example.com/real-node=true:NoSchedule
    server=$("$KUBECTL" config view --minify -o jsonpath='{.clusters[0].cluster.server}')
    # The local cluster's API server and its dev processes (hack/dev-cluster.sh run), from its state.
    read -r local_server extras < <(python3 -c 'import json, sys
try:
    state = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    state = {}
print(state.get("server", "-"), ",".join(state.get("extras") or {}) or "-")' "$DEV/run/state.json")
    if [[ -z "$IMAGE" && "$server" == "$local_server" ]]; then
      IMAGE=trainingjob-operator:$(sed -n 's/^version = //p' "$REPO/setup.cfg")
      TJ_DEV_DIR=$DEV "$REPO/hack/dev-cluster.sh" up --with real-node --images operator >&2 ||
        fail "could not give the real node the operator's image (above); nothing was applied"
    fi
    echo "deploy: the local cluster: the operator goes on its real node ${real_node#node/}," \
      "image ${IMAGE:-trainingjob-operator} (kwok's nodes run no container)"
    if [[ "$server" == "$local_server" && ",$extras," == *,operator,* ]]; then
      TJ_DEV_DIR=$DEV "$REPO/hack/dev-cluster.sh" stop operator >&2
      echo "deploy: stopped the demo's operator (a process on this machine): the deployed one takes over its jobs"
    fi
  fi
fi

# Label keys and values as the API server takes them (it checks the lengths); effects of a taint.
label_key='([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?'
label_value='([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?'
effect='NoSchedule|PreferNoSchedule|NoExecute'

# NODE_SELECTOR as the members of a JSON object ("key": "value", ...), checked here in the script's own
# shell so that a bad one stops it.
selector_members=""
IFS=, read -ra items <<<"$NODE_SELECTOR"
for item in "${items[@]}"; do
  [[ "$item" =~ ^($label_key)=($label_value)$ ]] ||
    fail "NODE_SELECTOR: '$item' is not a node label key=value (e.g. NODE_SELECTOR=pool=system,zone=a)"
  selector_members+="${selector_members:+, }\"${item%%=*}\": \"${item#*=}\""
done

# TOLERATE as the items of a JSON array, one toleration per taint.
toleration_items=""
IFS=, read -ra items <<<"$TOLERATE"
for item in "${items[@]}"; do
  [[ "$item" =~ ^($label_key)(=($label_value))?(:($effect))?$ ]] ||
    fail "TOLERATE: '$item' is not a taint key[=value][:Effect] with Effect one of ${effect//|/, }" \
      "(e.g. TOLERATE=dedicated=system:NoSchedule)"
  taint=${item%%:*}
  effect_field=""
  [[ "$item" == *:* ]] && effect_field=", \"effect\": \"${item#*:}\""
  if [[ "$taint" == *=* ]]; then
    toleration="{\"key\": \"${taint%%=*}\", \"operator\": \"Equal\", \"value\": \"${taint#*=}\"$effect_field}"
  else
    toleration="{\"key\": \"$taint\", \"operator\": \"Exists\"$effect_field}"
  fi
  toleration_items+="${toleration_items:+, }$toleration"
done

# IMAGE_PULL_SECRETS as the items of a JSON array of references, Secret names as the API server takes them.
pull_secret_items=""
IFS=, read -ra items <<<"$IMAGE_PULL_SECRETS"
for item in "${items[@]}"; do
  [[ "$item" =~ ^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$ ]] ||
    fail "IMAGE_PULL_SECRETS: '$item' is not a Secret's name (e.g. IMAGE_PULL_SECRETS=registry-credentials)"
  pull_secret_items+="${pull_secret_items:+, }{\"name\": \"$item\"}"
done

# The API server's endpoints for the network-policy overlay's egress rule, as the members of two JSON
# arrays: ipBlocks ({"ipBlock": {"cidr": ...}}, an address alone as /32 or /128) and ports.
api_server_rule=""
if [[ -n "$API_SERVER_ADDRESSES$API_SERVER_PORTS" && "$OVERLAY" != network-policy ]]; then
  fail "API_SERVER_ADDRESSES and API_SERVER_PORTS are for OVERLAY=network-policy"
fi
if [[ "$OVERLAY" == network-policy && "$ACTION" != delete ]]; then
  addresses=$API_SERVER_ADDRESSES ports=$API_SERVER_PORTS
  slices=(get endpointslices -n default -l kubernetes.io/service-name=kubernetes --request-timeout=10s)
  if [[ -z "$addresses" ]] && "$KUBECTL" version --request-timeout=5s >/dev/null 2>&1; then
    addresses=$("$KUBECTL" "${slices[@]}" -o jsonpath='{.items[*].endpoints[*].addresses[*]}' | tr ' ' ,)
  fi
  if [[ -z "$ports" && -n "$addresses" ]] && "$KUBECTL" version --request-timeout=5s >/dev/null 2>&1; then
    ports=$("$KUBECTL" "${slices[@]}" -o jsonpath='{.items[*].ports[*].port}' | tr ' ' ,)
  fi
  [[ -n "$addresses" ]] || fail "API_SERVER_ADDRESSES: no address of the API server (the kubernetes Service's" \
    "EndpointSlices in default list none, or no cluster answers); set API_SERVER_ADDRESSES=ip,... and API_SERVER_PORTS"
  [[ -n "$ports" ]] || fail "API_SERVER_PORTS: no port of the API server's endpoints; set API_SERVER_PORTS=6443 (or theirs)"
  api_server_rule=$(python3 - "$addresses" "$ports" <<'PY'
import ipaddress, json, sys
addresses, ports = (list(dict.fromkeys(filter(None, text.split(",")))) for text in sys.argv[1:])
blocks = []
for text in addresses:
    try:
        blocks.append({"ipBlock": {"cidr": str(ipaddress.ip_network(text.strip(), strict=True))}})
    except ValueError:
        sys.exit(f"deploy: API_SERVER_ADDRESSES: '{text}' is not an IP address or a CIDR (e.g. 10.0.0.2 or 10.0.0.0/28)")
numbers = []
for text in ports:
    if not text.strip().isdigit() or not 1 <= int(text) <= 65535:
        sys.exit(f"deploy: API_SERVER_PORTS: '{text}' is not a port number (e.g. 6443)")
    numbers.append(int(text))
rule = {"to": blocks, "ports": [{"port": port, "protocol": "TCP"} for port in dict.fromkeys(numbers)]}
print(json.dumps([{"op": "replace", "path": "/spec/egress/0", "value": rule}]))
PY
) || exit 1
fi

# The throwaway kustomization's additions to the chosen one: the image, the pods' placement as a
# strategic merge patch of the Deployment (JSON, which is YAML), and the NetworkPolicy's API server rule
# as a JSON patch.
customizations() {
  if [[ -n "$IMAGE" ]]; then
    local name=${IMAGE%:*} tag=${IMAGE##*:}
    [[ "$IMAGE" == *:* && "$tag" != */* ]] || { name=$IMAGE; tag=latest; }
    printf 'images:\n  - name: trainingjob-operator\n    newName: "%s"\n    newTag: "%s"\n' "$name" "$tag"
  fi
  [[ -z "$selector_members$toleration_items$pull_secret_items$api_server_rule" ]] || printf 'patches:\n'
  if [[ -n "$selector_members$toleration_items$pull_secret_items" ]]; then
    local pod_spec=""
    [[ -z "$selector_members" ]] || pod_spec="\"nodeSelector\": {$selector_members}"
    [[ -z "$toleration_items" ]] || pod_spec+="${pod_spec:+, }\"tolerations\": [$toleration_items]"
    [[ -z "$pull_secret_items" ]] || pod_spec+="${pod_spec:+, }\"imagePullSecrets\": [$pull_secret_items]"
    printf '  - target:\n      kind: Deployment\n      name: trainingjob-operator\n    patch: |-\n'
    printf '      {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "trainingjob-operator"},\n'
    printf '       "spec": {"template": {"spec": {%s}}}}\n' "$pod_spec"
  fi
  if [[ -n "$api_server_rule" ]]; then
    printf '  - target:\n      kind: NetworkPolicy\n      name: trainingjob-operator\n    patch: |-\n'
    printf '      %s\n' "$api_server_rule"
  fi
}

work=$(mktemp -d "${TMPDIR:-/tmp}/trainingjob-deploy.XXXXXX")
trap 'rm -rf "$work"' EXIT
rendered=$work/rendered.yaml
additions=$(customizations)
if [[ -n "$additions" ]]; then
  # A throwaway kustomization on top of the chosen one; it lives inside the repo because kustomize
  # loads other kustomizations by relative path.
  overlay_dir=$(mktemp -d "$REPO/.dev-deploy.XXXXXX")
  trap 'rm -rf "$work" "$overlay_dir"' EXIT
  printf 'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - ../%s\n%s\n' \
    "$source_dir" "$additions" >"$overlay_dir/kustomization.yaml"
  "$KUBECTL" kustomize "$overlay_dir" >"$rendered"
  rm -rf "$overlay_dir"  # at once: rendering is all it is for
else
  "$KUBECTL" kustomize "$REPO/$source_dir" >"$rendered"
fi

if [[ "$ACTION" == render ]]; then
  cat "$rendered"
  exit 0
fi

if [[ "$ACTION" == delete ]]; then
  if [[ "${DELETE_CRD:-0}" == 1 ]]; then
    # The jobs go first, while the operator still runs: it takes its tracking finalizer off their
    # pods once they are accounted for (docs/accounting.md). Removed after it, they would be held.
    if "$KUBECTL" get crd trainingjobs.ml.example.com >/dev/null 2>&1; then
      "$KUBECTL" delete trainingjobs --all --all-namespaces --ignore-not-found --wait=true --timeout=120s
      held() {
        "$KUBECTL" get pods --all-namespaces -l app.kubernetes.io/managed-by=trainingjob-operator \
          -o jsonpath='{range .items[*]}{.metadata.namespace}/{.metadata.name} {.metadata.finalizers}{"\n"}{end}' |
          grep -F ml.example.com/trainingjob-tracking || true
      }
      for _ in $(seq 120); do
        [[ -z "$(held)" ]] && break
        sleep 1
      done
      if [[ -n "$(held)" ]]; then
        fail "pods of deleted TrainingJobs are still held by the ml.example.com/trainingjob-tracking finalizer" \
          "(is the operator running?); nothing was removed. See docs/accounting.md to release them by hand."
      fi
    fi
    "$KUBECTL" delete --ignore-not-found -f "$rendered"
    echo "deploy: removed the operator and the TrainingJob CRD"
  else
    # Every rendered document except crd/'s, which carry the label app.kubernetes.io/name=trainingjob
    # (kustomize separates documents with '---' lines): the CRD, the trainers' ClusterRole, and the
    # admission policies and their bindings, which guard the jobs that remain (the trainers' ClusterRole
    # lets them patch pods, and one policy narrows it to their own progress; the others keep the jobs'
    # immutable spec fields as they are and their pods within what their creators may do). The policies
    # on the operator's own writes go with the operator.
    awk 'function flush() { if (doc !~ crd_label) printf "%s", doc; doc = "" }
         /^---$/ { flush(); print; next } { doc = doc $0 "\n" } END { flush() }' \
      crd_label='\n    app.kubernetes.io/name: trainingjob\n' \
      "$rendered" >"$work/without-crd.yaml"
    "$KUBECTL" delete --ignore-not-found -f "$work/without-crd.yaml"
    echo "deploy: removed the operator; the TrainingJob CRD, the admission policies and the jobs remain" \
      "(with the trainers' ClusterRole; DELETE_CRD=1 removes them too)"
  fi
  exit 0
fi

# A server-side dry run needs the target namespaces to exist: create the missing ones now and remove
# them again if anything is refused, so a refused install leaves nothing behind.
created_namespaces=()
rollback() {
  for ns in "${created_namespaces[@]}"; do "$KUBECTL" delete namespace "$ns" --ignore-not-found --wait=false >/dev/null; done
}
for ns in $("$KUBECTL" create --dry-run=client -f "$rendered" -o jsonpath='{.metadata.namespace}{"\n"}' | sort -u); do
  if ! "$KUBECTL" get namespace "$ns" >/dev/null 2>&1; then
    "$KUBECTL" create namespace "$ns" >/dev/null
    created_namespaces+=("$ns")
  fi
done
echo "deploy: validating $(grep -c '^kind:' "$rendered") objects from $source_dir with a server-side dry run"
if ! "$KUBECTL" apply --server-side --force-conflicts --dry-run=server -f "$rendered" >/dev/null; then
  rollback
  fail "the cluster refused the manifests (above); nothing was applied"
fi
if ! "$KUBECTL" apply --server-side --force-conflicts -f "$rendered"; then
  rollback
  fail "applying failed part-way (above); namespaces created by this run were removed"
fi
"$KUBECTL" wait --for=condition=Established --timeout=60s crd/trainingjobs.ml.example.com
# An earlier version of the operator made a Role trainingjob-trainer in each namespace its jobs ran in.
# The trainers' rights are now the ClusterRole of crd/, which the operator binds (it replaces the old
# RoleBindings) and it has no rights on Roles, so the installer removes them: the earlier version's
# labels and name only, in every namespace; a second run finds none.
"$KUBECTL" delete roles --all-namespaces --ignore-not-found \
  -l app.kubernetes.io/managed-by=trainingjob-operator,app.kubernetes.io/component=trainer \
  --field-selector metadata.name=trainingjob-trainer
image=$("$KUBECTL" get deploy -n trainingjob-system trainingjob-operator -o jsonpath='{.spec.template.spec.containers[0].image}' 2>/dev/null || true)
echo "deploy: installed. The Deployment runs image '${image:-?}'; to run your build, build and push it where the cluster"
echo "        pulls from and deploy it: make docker-build docker-push deploy IMG=<registry>/trainingjob-operator:<tag>."
echo "        Watch it: kubectl -n trainingjob-system rollout status deploy/trainingjob-operator"
