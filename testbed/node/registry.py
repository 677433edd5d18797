"""The local cluster's image registry: `hack/dev-cluster.sh up --with registry`.

Why: every image used to reach the real node by `ctr import`, so the path users depend on (an image
pulled from a registry over TLS, with the credentials of an imagePullSecret) had never run, and `make
deploy` could not be pointed at a pushed image. This part runs a real registry, the CNCF distribution
project's (hack/kube-bins.sh builds it from Go modules), that `make docker-push` pushes to and the
node's containerd pulls from.

Where it listens. Pushes come from the machine and pulls from the node's containerd, which runs in the
node's network namespace. The registry runs in that namespace too, at the node's own address (`HOST`,
NODE_IP:PORT): containerd reaches it as an address of its own host, and the machine over the node's
veth pair (the machine's end holds the link's other address, so the route is direct). Nothing
listens outside the namespace. So an image has one name for the push and the pull, `HOST/<path>:<tag>`.

TLS: a serving certificate of the cluster's CA for the node's address. The node's containerd trusts
the CA through a hosts.toml under its registry `config_path` (testbed/node/nodeconfig.py); containerd
reads that directory at each pull, so adding the file to a running node needs no restart.

Authentication: htpasswd, one user with a random password per cluster. The bcrypt entry is written
by Apache's `htpasswd -B` (apache2-utils, in `make node-tools`): the tool the htpasswd format comes
from, maintained with Apache httpd, that reads the password on stdin; the registry accepts bcrypt
entries only. Its default cost (5) is kept: the registry checks the hash on every request of a pull,
and the password is a throwaway of one cluster on an address only this machine reaches. The
credentials are also written as a docker config file (`auth.json`): what a
`kubernetes.io/dockerconfigjson` Secret holds, and what `make docker-push` reads for this host.

Storage: a directory of the run directory (gone with `down`); as it starts, the node's containerd
forgets what it pulled from an earlier registry at the same address. Recorded in state.json (`registry`) and
as the component `registry` (`status`, `stop`/`start`/`restart` for an outage); `remove registry`,
`remove real-node` and `down` stop it and take its hosts.toml away.
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import ssl
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from testbed.cluster import kube_bins
from testbed.cluster.pki import issue
from testbed.cluster.processes import spawn, stop_processes, wait_for
from testbed.cluster.state import REGISTRY, RUN, read_state, read_versions, record_started, say, write_state
from testbed.common import ToolError, http_get
from testbed.node import nodeconfig, nodehost, realnode

NAME: Final = REGISTRY
BUILD: Final = "registry"
PORT: Final = 5000
HOST: Final = f"{nodeconfig.NODE_IP}:{PORT}"
USER: Final = "trainingjob"
REALM: Final = "trainingjob-dev"
HTPASSWD: Final = Path("/usr/bin/htpasswd")


@dataclass(frozen=True)
class Files:
    """Where the registry keeps its files: its own directory of the run directory, and the node's
    containerd registry configuration directory (`config_path`)."""

    directory: Path
    hosts_dir: Path

    @property
    def config(self) -> Path:
        return self.directory / "config.json"

    @property
    def htpasswd(self) -> Path:
        return self.directory / "htpasswd"

    @property
    def auth_file(self) -> Path:
        """The credentials as a docker config file (`{"auths": {HOST: ...}}`)."""
        return self.directory / "auth.json"

    @property
    def storage(self) -> Path:
        return self.directory / "storage"

    @property
    def hosts_toml(self) -> Path:
        return self.hosts_dir / HOST / "hosts.toml"


def files(run: Path = RUN) -> Files:
    return Files(run / "registry", nodeconfig.registry_hosts_dir(run / "node"))


def ca_file(run: Path = RUN) -> Path:
    return run / "pki" / "ca.crt"


def missing_prerequisites() -> list[str]:
    """Why the registry cannot run here (empty when it can), beside the real node's own reasons."""
    reasons = nodehost.missing_prerequisites()
    if not HTPASSWD.exists():
        reasons.append(f"{HTPASSWD} is missing (Debian's apache2-utils; `make node-tools` installs it)")
    return reasons


# ------------------------------------------------------------------------------ its configuration


def configuration(where: Files, pki: Path, http_secret: str, address: str = HOST) -> dict[str, Any]:
    """The registry's configuration (JSON is YAML): listening at `address` with TLS (`pki`'s
    registry.crt, signed by the cluster's CA), htpasswd, the filesystem driver under the run
    directory, deletes allowed (a test may take an image away), an access log line per request (which
    pulls reached it), and no storage health check."""
    return {
        "version": "0.1",
        "log": {"level": "info", "formatter": "text", "accesslog": {"disabled": False}},
        "storage": {
            "filesystem": {"rootdirectory": str(where.storage)},
            "delete": {"enabled": True},
        },
        "http": {
            "addr": address,
            "secret": http_secret,
            "tls": {"certificate": str(pki / "registry.crt"), "key": str(pki / "registry.key")},
        },
        "auth": {"htpasswd": {"realm": REALM, "path": str(where.htpasswd)}},
        "health": {"storagedriver": {"enabled": False}},
    }


def hosts_toml(ca: Path) -> str:
    """containerd's registry host configuration for HOST: pull and resolve over HTTPS, trusting `ca`."""
    return (
        f'server = "https://{HOST}"\n\n'
        f'[host."https://{HOST}"]\n'
        '  capabilities = ["pull", "resolve"]\n'
        f'  ca = "{ca}"\n'
    )


def docker_config(user: str, password: str, host: str = HOST) -> dict[str, Any]:
    """A docker config file's content with one registry's credentials (the `.dockerconfigjson` of an
    imagePullSecret)."""
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"auths": {host: {"username": user, "password": password, "auth": token}}}


def bcrypt_entry(user: str, password: str) -> str:
    """One htpasswd line with a bcrypt hash, from `htpasswd -niB` (the password on stdin)."""
    result = subprocess.run(
        [str(HTPASSWD), "-niB", user], input=password, capture_output=True, text=True, check=False
    )
    if result.returncode != 0 or not result.stdout.startswith(f"{user}:$2"):
        raise ToolError(f"htpasswd -niB failed: {(result.stderr or result.stdout).strip()}")
    return result.stdout.strip() + "\n"


def credentials(where: Files | None = None) -> tuple[str, str]:
    """The running registry's user and password."""
    config = json.loads((where or files()).auth_file.read_text())
    entry = config["auths"][HOST]
    return str(entry["username"]), str(entry["password"])


# ---------------------------------------------------------------------------------------------- add


def add(state: dict[str, Any], build_dir: Path) -> None:
    """Starts the registry on the running cluster of `state` with its real node; one that runs is
    left alone. On any failure, undoes what it did."""
    if state.get("registry"):
        say(f"{NAME} is already running at {HOST}")
        return
    if not state.get("real_node"):
        raise ToolError(f"{NAME} needs the real node: `hack/dev-cluster.sh up --with real-node,{NAME}`")
    reasons = missing_prerequisites()
    if reasons:
        raise ToolError(f"{NAME} cannot run here: " + "; ".join(reasons))
    record: dict[str, Any] = {"host": HOST}
    state["registry"] = record
    write_state("registry", record)
    try:
        start(state, build_dir)
    except BaseException:
        say(f"{NAME} did not start; undoing what was done")
        remove(state)
        raise
    record_started(state, NAME, {"REGISTRY_VERSION": read_versions(build_dir)["VERSION"]})


def start(state: dict[str, Any], build_dir: Path) -> None:
    where = files()
    pki = RUN / "pki"
    where.storage.mkdir(parents=True, exist_ok=True)
    issue(
        pki,
        "registry",
        f"/CN={nodeconfig.NODE_IP}",
        f"subjectAltName=IP:{nodeconfig.NODE_IP}\nextendedKeyUsage=serverAuth",
    )
    password = secrets.token_urlsafe(24)
    where.htpasswd.write_text(bcrypt_entry(USER, password))
    where.auth_file.write_text(json.dumps(docker_config(USER, password), indent=2) + "\n")
    for secret in (where.htpasswd, where.auth_file):
        secret.chmod(0o600)
    where.config.write_text(json.dumps(configuration(where, pki, secrets.token_hex(16)), indent=2))
    where.hosts_toml.parent.mkdir(parents=True, exist_ok=True)
    where.hosts_toml.write_text(hosts_toml(ca_file()))
    # An empty environment: the registry reads every REGISTRY_* variable as a setting (REGISTRY_AUTH_FILE,
    # which `hack/dev-cluster.sh env` exports for the push tools, would be its `auth` section), and its
    # tracing would export to an OTLP collector on the namespace's loopback, where none listens.
    binary, args = nodeconfig.in_node(
        "/usr/bin/env",
        ["-i", "OTEL_TRACES_EXPORTER=none", str(build_dir / BUILD), "serve", str(where.config)],
    )
    spawn(NAME, Path(binary), args, state["processes"])
    wait_ready(state)
    forget_earlier_pulls()
    say(f"{NAME}: https://{HOST} (user {USER}; credentials in {where.auth_file}), storage {where.storage}")


def forget_earlier_pulls() -> None:
    """Removes from the node's containerd the images it pulled from an earlier registry at HOST (an
    earlier cluster's, whose storage went with its `down`; containerd's store is kept in the cache):
    a tag pushed to this one is then pulled from it, not taken from what the node held under that
    name."""
    builds = {"containerd": kube_bins.ensure("containerd")}
    stale = [
        name for name in realnode.ctr(builds, "images", "list", "-q").split() if name.startswith(f"{HOST}/")
    ]
    if stale:
        realnode.ctr(builds, "images", "rm", *stale)
        say(f"{NAME}: the node forgot {len(stale)} image(s) pulled from an earlier registry at {HOST}")


# ------------------------------------------------------------------------------------------ readiness


def tls_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca_file()))


def serves() -> bool:
    """The registry answers over TLS with the cluster CA's certificate and asks for credentials."""
    status, _ = http_get(f"https://{HOST}/v2/", context=tls_context())
    return status == 401


def wait_ready(state: dict[str, Any], component: str = NAME) -> None:
    """After `add`, `start` or `restart`: waits until it serves."""
    wait_for(f"{component} serving at https://{HOST}/v2/", serves, state["processes"], timeout=60)


def endpoint() -> str:
    """Where it serves, for `status`."""
    return f"{HOST} in netns {nodeconfig.NETNS}"


def local_access(host: str) -> tuple[Path, Path] | None:
    """(the docker config file with its credentials, the CA that signed its certificate) when `host` is
    the registry of the cluster in this checkout's run directory and it runs; None otherwise."""
    state = read_state()
    if host != HOST or not state or not state.get("registry"):
        return None
    return files().auth_file, ca_file()


# ------------------------------------------------------------------------------------------- remove


def remove(state: dict[str, Any]) -> None:
    """Stops the registry and takes its hosts.toml away; its storage goes with the run directory."""
    processes: dict[str, Any] = state.get("processes", {})
    if NAME in processes:
        stop_processes({NAME: processes.pop(NAME)})
    shutil.rmtree(files().hosts_toml.parent, ignore_errors=True)
    if NAME in state.get("optional", []):
        state["optional"].remove(NAME)
    state.pop("registry", None)
    if read_state() is not None:
        write_state("processes", processes)
        write_state("optional", state.get("optional", []))
        write_state("registry", None)
