#!/usr/bin/env bash
# Local Kubernetes control plane for development, tests and the demo (see testbed/cluster/README.md).
#   hack/dev-cluster.sh up [--nodes N --gpus-per-node G --cpu-per-node C --memory-per-node M]
#                          [--with kueue,coscheduling,volcano,multikueue]   (optional components; also on a running cluster)
#                          [--images all|NAME,...]       (the real node's images besides its own; default all)
#   hack/dev-cluster.sh down | status | env
#   hack/dev-cluster.sh restart | stop | start <component>
#   hack/dev-cluster.sh run <name> [--wait-http URL] -- <command...>    (a dev process; `stop <name>`)
set -euo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" exec python3 -m testbed.cluster "$@"
