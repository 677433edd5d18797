"""The real node's settings: its addresses and paths, and every configuration file and command line of
its kubelet, containerd, CNI, kube-proxy and CoreDNS, as pure functions of them.

Why apart: each setting here is a decision with a reason (measured on this kind of machine, see
testbed/node/README.md), and reading them together, away from the start-up sequence in
testbed/node/realnode.py, is how they are reviewed and tested. Nothing here touches the machine.

Addressing. The node is a network namespace of its own, `NETNS`, joined to the machine by one veth
pair whose two addresses (`HOST_IP` on the machine's side, `NODE_IP` inside) are the only addresses
the machine gains; its pods sit on a bridge inside the namespace (`POD_CIDR`). Nothing is routed
beyond: pods reach the node, each other, the Services and, through the relay of
testbed/node/apiforward.py at `NODE_IP:API_PORT`, the API server; nothing else.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

NODE_NAME: Final = "real-node"
NETNS: Final = "trainingjob-node"
# The machine's end of the veth pair, and the node's end (renamed eth0 inside the namespace).
HOST_LINK: Final = "tjnode0"
NODE_LINK: Final = "eth0"
LINK_PREFIX: Final = 30
HOST_IP: Final = "172.31.250.1"
NODE_IP: Final = "172.31.250.2"
POD_CIDR: Final = "10.244.0.0/24"
POD_GATEWAY: Final = "10.244.0.1"
BRIDGE: Final = "cni0"
# The cluster's Service network (the API server's --service-cluster-ip-range): the API server's own
# Service takes the first address, the cluster DNS the tenth, as kubeadm does.
SERVICE_CIDR: Final = "10.96.0.0/16"
API_SERVICE_IP: Final = "10.96.0.1"
DNS_SERVICE_IP: Final = "10.96.0.10"
CLUSTER_DOMAIN: Final = "cluster.local"
# The relay to the API server inside the node's namespace (the port a real cluster's API server uses).
API_PORT: Final = 6443
KUBELET_PORT: Final = 10250
# Only pods that tolerate this taint land on the real node; the label selects it.
REAL_NODE_LABEL: Final = "ml.example.com/real-node"
TAINT: Final = {"key": REAL_NODE_LABEL, "value": "true", "effect": "NoSchedule"}
# What the node advertises, like the fake GPU nodes: GPUs no container gets (CPU training).
GPUS: Final = 8
GPU_PRODUCT: Final = "A100-SXM4-80GB"
# Containerd's namespace for Kubernetes' containers and images.
CONTAINERD_NAMESPACE: Final = "k8s.io"
# The kubelet sets these (its kernel tunables) and kube-proxy none outside the node's namespace:
# saved before the kubelet starts, restored after it stops.
KERNEL_TUNABLES: Final = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# Where the node's containers' cgroups and the runtime's own processes go, in every cgroup v1
# hierarchy: the kubelet's cgroupRoot, and containerd with its shims beside it.
CGROUP_ROOT: Final = "trainingjob-node"
RUNTIME_CGROUP: Final = "trainingjob-node.runtime"
# Short fixed paths of the node (one per machine): the runtime's sockets, and the kubelet's root.
SOCKETS_DIR: Final = Path("/run/trainingjob-node")
STATE_DIR: Final = Path("/var/lib/trainingjob-node")
# runc and the CNI plugins come from Debian's packages.
RUNC: Final = Path("/usr/sbin/runc")
CNI_BIN_DIR: Final = Path("/usr/lib/cni")


@dataclass(frozen=True)
class NodePaths:
    """Where the node keeps its files. `run` is inside the dev cluster's run directory (gone with it):
    configuration, certificates, volumes of the storage provisioner; `sockets` a short path under
    /run for the runtime's sockets; `kubelet_root` a short path on disk for the kubelet's pods (it
    makes unix sockets under it, whose paths may not exceed 107 bytes, so it cannot be under a
    repository checked out anywhere); `images` containerd's root in the cache (imported images
    survive `down`, so a cached `up` takes seconds)."""

    run: Path
    sockets: Path
    kubelet_root: Path
    images: Path

    @property
    def containerd_socket(self) -> Path:
        return self.sockets / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.run / "containerd.toml"

    @property
    def containerd_state(self) -> Path:
        return self.sockets / "containerd"

    @property
    def cni_conf_dir(self) -> Path:
        return self.run / "cni" / "net.d"

    @property
    def cni_data(self) -> Path:
        return self.run / "cni" / "data"

    @property
    def pod_logs(self) -> Path:
        return self.run / "pod-logs"

    @property
    def kubelet_config(self) -> Path:
        return self.run / "kubelet-config.json"

    @property
    def resolv_conf(self) -> Path:
        return self.run / "resolv.conf"

    @property
    def kube_proxy_config(self) -> Path:
        return self.run / "kube-proxy-config.json"

    @property
    def corefile(self) -> Path:
        return self.run / "Corefile"

    @property
    def registry_hosts(self) -> Path:
        return registry_hosts_dir(self.run)

    @property
    def storage(self) -> Path:
        """The local-path provisioner's volumes (testbed/node/storage.py)."""
        return self.run / "volumes"

    def kubeconfig(self, user: str) -> Path:
        return self.run / f"{user}.kubeconfig"


def registry_hosts_dir(node_run: Path) -> Path:
    """containerd's registry configuration directory (`config_path`): a directory per registry host
    holding its hosts.toml (testbed/node/registry.py writes the local registry's)."""
    return node_run / "certs.d"


def netns_path() -> Path:
    return Path("/run/netns") / NETNS


def in_node(binary: Path | str, args: list[str]) -> tuple[str, list[str]]:
    """A command line run inside the node's network namespace only (not its mount namespace: the
    kubelet's volume mounts must be the ones containerd and runc see). nsenter execs the binary, so
    the recorded pid is the component's."""
    return "/usr/bin/nsenter", [f"--net={netns_path()}", "--", str(binary), *args]


def in_cgroup(cgroup: str, binary: str, args: list[str]) -> tuple[str, list[str]]:
    """A command line whose process first moves itself into `cgroup` of every cgroup v1 hierarchy (so
    that its children, containerd's shims, are found and stopped there), then execs the command."""
    script = 'for d in /sys/fs/cgroup/*/"$0"; do echo $$ > "$d/cgroup.procs"; done; exec "$@"'
    return "/bin/sh", ["-c", script, cgroup, binary, *args]


# ------------------------------------------------------------------------------------- containerd


def containerd_config(paths: NodePaths, sandbox_image: str) -> str:
    """containerd 2's configuration (version 3): its own root, state and socket; the CRI plugin with
    runc (cgroupfs, no systemd here), the CNI bridge of the node's namespace and the locally built
    pause image. `restrict_oom_score_adj` is essential on this kind of machine: without
    CAP_SYS_RESOURCE in the bounding set (even as root) runc cannot lower a sandbox's oom_score_adj,
    and every sandbox fails with "can't get final child's PID from pipe: EOF". Pod network namespaces
    are kept under the state directory, not the machine's /run/netns, and so is runc's state. No
    configuration is imported from /etc, and what would read or write fixed paths of the machine is
    off: NRI, CDI, the `opt` plugin, the snapshotters not used; the image verifier looks in the run
    directory, and registries' hosts.toml files (the local registry's CA) in `registry_hosts`."""
    state = paths.containerd_state
    disabled = [
        "io.containerd.nri.v1.nri",
        "io.containerd.internal.v1.opt",
        "io.containerd.snapshotter.v1.blockfile",
        "io.containerd.snapshotter.v1.erofs",
        "io.containerd.differ.v1.erofs",
        "io.containerd.mount-handler.v1.erofs",
        "io.containerd.tracing.processor.v1.otlp",
        "io.containerd.internal.v1.tracing",
    ]
    lines = [
        "version = 3",
        f"root = {_toml(paths.images / 'root')}",
        f"state = {_toml(state)}",
        f"temp = {_toml(paths.run / 'containerd-tmp')}",
        "imports = []",
        "disabled_plugins = [" + ", ".join(_toml(name) for name in disabled) + "]",
        "",
        "[grpc]",
        f"  address = {_toml(paths.containerd_socket)}",
        "[ttrpc]",
        f"  address = {_toml(paths.sockets / 'containerd.sock.ttrpc')}",
        "[debug]",
        "  level = 'info'",
        "",
        "[plugins.'io.containerd.cri.v1.images']",
        "  snapshotter = 'overlayfs'",
        "  [plugins.'io.containerd.cri.v1.images'.pinned_images]",
        f"    sandbox = {_toml(sandbox_image)}",
        "  [plugins.'io.containerd.cri.v1.images'.registry]",
        f"    config_path = {_toml(paths.registry_hosts)}",
        "",
        "[plugins.'io.containerd.cri.v1.runtime']",
        "  restrict_oom_score_adj = true",
        "  netns_mounts_under_state_dir = true",
        "  enable_selinux = false",
        "  enable_cdi = false",
        "  enable_criu = false",
        "  [plugins.'io.containerd.cri.v1.runtime'.containerd]",
        "    default_runtime_name = 'runc'",
        "    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]",
        "      runtime_type = 'io.containerd.runc.v2'",
        "      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]",
        f"        BinaryName = {_toml(RUNC)}",
        f"        Root = {_toml(state / 'runc')}",
        "        SystemdCgroup = false",
        "  [plugins.'io.containerd.cri.v1.runtime'.cni]",
        f"    bin_dirs = [{_toml(CNI_BIN_DIR)}]",
        f"    conf_dir = {_toml(paths.cni_conf_dir)}",
        "    max_conf_num = 1",
        "",
        "[plugins.'io.containerd.image-verifier.v1.bindir']",
        f"  bin_dir = {_toml(paths.run / 'image-verifiers')}",
        "",
        "[plugins.'io.containerd.grpc.v1.cri']",
        "  stream_server_address = '127.0.0.1'",
        "  stream_server_port = '0'",
        "",
    ]
    return "\n".join(lines)


def _toml(value: Path | str) -> str:
    """A TOML literal string (single quotes: no escapes inside)."""
    text = str(value)
    if "'" in text or "\n" in text:
        raise ValueError(f"cannot write {text!r} as a TOML literal string")
    return f"'{text}'"


def cni_conflist(paths: NodePaths) -> dict[str, Any]:
    """The pod network: a bridge inside the node's namespace with host-local addresses (their leases
    under the run directory), pods' default route through it, no masquerading (nothing is beyond)."""
    return {
        "cniVersion": "1.0.0",
        "name": "trainingjob-node",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_CIDR, "gateway": POD_GATEWAY}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(paths.cni_data),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }


# ---------------------------------------------------------------------------------------- kubelet


def kubelet_config(paths: NodePaths, pki: Path) -> dict[str, Any]:
    """KubeletConfiguration (JSON is YAML): serving on the node's address with the cluster CA's
    certificate, webhook authentication and authorisation as on a real node (the API server's calls
    for logs, exec and port-forward are checked), cgroup v1 with the cgroupfs driver under a cgroup
    root of its own, and every path it would write on the machine moved under the run directory."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": NODE_IP,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": 10248,
        "tlsCertFile": str(pki / "real-node.crt"),
        "tlsPrivateKeyFile": str(pki / "real-node.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True, "cacheTTL": "30s"},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{paths.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        # The machine's resolver is not the pods' business: nothing beyond the node is reachable.
        "resolvConf": str(paths.resolv_conf),
        "podLogsDir": str(paths.pod_logs),
        "volumePluginDir": str(paths.run / "volume-plugins"),
        "registerWithTaints": [TAINT],
        "maxPods": 60,
        "serializeImagePulls": False,
        # Images are built here and cannot be pulled again: never collected for disk space (they are
        # pinned too, realnode.import_images: disk pressure collects unpinned images whatever these say).
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        # The disk is the machine's, shared with everything else on it: a percentage of a large shared
        # disk is gigabytes that others use and fill (2% of a 250 GB disk is 5 GB; under pressure the
        # node refuses pods for the 5 minutes pressure lasts by default). The node is under pressure
        # when the disk is really full, and not for long after.
        "evictionHard": {"memory.available": "256Mi", "nodefs.available": "1Gi", "imagefs.available": "1Gi"},
        "evictionPressureTransitionPeriod": "30s",
        "nodeStatusReportFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "makeIPTablesUtilChains": True,
        "logging": {"format": "text", "verbosity": 1},
    }


def kubelet_args(paths: NodePaths, labels: dict[str, str]) -> list[str]:
    return [
        f"--config={paths.kubelet_config}",
        f"--kubeconfig={paths.kubeconfig('kubelet')}",
        f"--root-dir={paths.kubelet_root}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={NODE_IP}",
        "--node-labels=" + ",".join(f"{key}={value}" for key, value in sorted(labels.items())),
    ]


def node_labels(gpu_product: str = GPU_PRODUCT, gpus: int = GPUS) -> dict[str, str]:
    """What the kubelet registers the node with (only labels a kubelet may set on itself: the
    NodeRestriction admission plugin refuses the others), like the fake GPU nodes'."""
    return {
        REAL_NODE_LABEL: "true",
        "node-type": "gpu",
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": gpu_product,
        "nvidia.com/gpu.count": str(gpus),
    }


# ----------------------------------------------------------------------------- kube-proxy, CoreDNS


def kube_proxy_config(paths: NodePaths) -> dict[str, Any]:
    """KubeProxyConfiguration: iptables mode in the node's namespace (its chains and sysctls stay
    there), masquerading all Service traffic so a pod reaching a peer on the same bridge through a
    ClusterIP gets its answer back through the node, and no change to the machine's conntrack
    settings (maxPerCore 0 and zero timeouts leave them as they are)."""
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(paths.kubeconfig("kube-proxy"))},
        "hostnameOverride": NODE_NAME,
        "bindAddress": NODE_IP,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        "mode": "iptables",
        "clusterCIDR": POD_CIDR,
        "iptables": {"masqueradeAll": True, "localhostNodePorts": False},
        "nodePortAddresses": [f"{NODE_IP}/32"],
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }


def kube_proxy_args(paths: NodePaths) -> list[str]:
    return [f"--config={paths.kube_proxy_config}", "--v=1"]


def corefile(paths: NodePaths) -> str:
    """CoreDNS serving the cluster's names from the API server, and nothing else: names outside the
    cluster get NXDOMAIN (nothing beyond the node is reachable, so nothing is forwarded)."""
    kubeconfig = paths.kubeconfig("coredns")
    return (
        f"{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{\n"
        f"    bind {NODE_IP}\n"
        "    errors\n"
        "    health 127.0.0.1:8080\n"
        "    ready 127.0.0.1:8181\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
        f"        kubeconfig {kubeconfig} trainingjob-dev\n"
        "        pods insecure\n"
        "        fallthrough in-addr.arpa ip6.arpa\n"
        "    }\n"
        "    cache 5\n"
        "}\n"
        ".:53 {\n"
        f"    bind {NODE_IP}\n"
        "    errors\n"
        "    template ANY ANY {\n"
        "        rcode NXDOMAIN\n"
        "    }\n"
        "}\n"
    )


def coredns_args(paths: NodePaths) -> list[str]:
    return ["-conf", str(paths.corefile)]


def dns_objects() -> list[dict[str, Any]]:
    """The cluster DNS Service (kube-system/kube-dns at DNS_SERVICE_IP, as kubeadm names it) and its
    EndpointSlice: CoreDNS runs as a process of the node, at the node's address."""
    return _service_with_endpoint(
        "kube-system",
        "kube-dns",
        DNS_SERVICE_IP,
        [("dns", "UDP", 53, 53), ("dns-tcp", "TCP", 53, 53)],
        labels={"k8s-app": "kube-dns"},
    )


def api_objects() -> list[dict[str, Any]]:
    """The EndpointSlice of the `kubernetes` Service: the API server, as pods reach it, is the relay
    at the node's address (the API server runs with --endpoint-reconciler-type=none and publishes none)."""
    slice_ = _endpoint_slice("default", "kubernetes", [("https", "TCP", API_PORT)])
    return [slice_]


def _service_with_endpoint(
    namespace: str,
    name: str,
    cluster_ip: str,
    ports: list[tuple[str, str, int, int]],
    labels: dict[str, str],
) -> list[dict[str, Any]]:
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "clusterIP": cluster_ip,
            "ports": [
                {"name": port, "protocol": protocol, "port": number, "targetPort": target}
                for port, protocol, number, target in ports
            ],
        },
    }
    endpoint = _endpoint_slice(
        namespace, name, [(port, protocol, target) for port, protocol, _, target in ports]
    )
    return [service, endpoint]


def _endpoint_slice(namespace: str, service: str, ports: list[tuple[str, str, int]]) -> dict[str, Any]:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service}-real-node",
            "namespace": namespace,
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "dev-cluster.trainingjob",
            },
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": [NODE_IP], "conditions": {"ready": True}, "nodeName": NODE_NAME}],
        "ports": [{"name": name, "protocol": protocol, "port": port} for name, protocol, port in ports],
    }


def json_text(document: dict[str, Any]) -> str:
    return json.dumps(document, indent=2) + "\n"
