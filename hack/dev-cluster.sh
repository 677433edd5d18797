#!/usr/bin/env bash
# Local Kubernetes control plane for development, tests and the demo (see hack/README.md).
#   hack/dev-cluster.sh up [--nodes N --gpus-per-node G --cpu-per-node C --memory-per-node M]
#   hack/dev-cluster.sh down | status | env
set -euo pipefail
exec python3 "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/devcluster.py" "$@"
