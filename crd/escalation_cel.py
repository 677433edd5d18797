"""The CEL of the escalation policy: crd/escalation.py's findings, written over the policy's `object`.

Why a module of its own: the policy's expressions are generated, like the immutability policy's, from
the same tables crd/escalation.py reads, control by control in the same order, so that the policy's
message and the Python function's list are one text (tests/e2e/test_tenant_escalation.py puts the same
cases through both). Each function here is the CEL twin of the function of the same name there.

The findings are built twice, over `object` and over `oldObject` (variables prefixed `new` and `old`),
so that an update is judged only on what it adds. CEL without list flattening (kube-apiserver 1.33 and
older have no `flatten`) gives one string per container: its findings joined by "; ", the separator the
messages use between findings too, so the texts agree.
"""

from __future__ import annotations

from collections.abc import Iterable

from crd import contract
from crd import escalation as e

TRAINER = contract.CONTAINER_NAME


def literal(value: str | bool | int) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def strings(values: Iterable[str]) -> str:
    return "[" + ", ".join(literal(value) for value in values) + "]"


def when(condition: str, text: str) -> str:
    """A list of the one finding `text` (a CEL string) when `condition` holds, else empty."""
    return f"({condition} ? [{text}] : [])"


def concat(lists: Iterable[str]) -> str:
    return " +\n".join(lists)


class Scope:
    """The policy's variables over one version of the job: `object` (prefix new) or `oldObject` (old)."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def var(self, name: str) -> str:
        return f"variables.{self.prefix}{name}"

    @property
    def spec(self) -> str:
        return self.var("Spec")

    @property
    def template(self) -> str:
        return self.var("Template")

    @property
    def context(self) -> str:
        return self.var("Context")

    @property
    def volumes(self) -> str:
        return self.var("Volumes")

    @property
    def trainer(self) -> str:
        return self.var("Trainer")

    def containers(self, kind: str) -> str:
        return self.var(kind[0].upper() + kind[1:])

    def path(self, kind: str, item: str = "c") -> str:
        """The CEL string of a container's field path (`item` bound by the enclosing macro), its index
        found by its name (containers are a list-map of names; comparing whole containers costs more)."""
        return f"'{e.TEMPLATE}.{kind}[' + string({self.containers(kind)}Names.indexOf({item}.name)) + ']'"

    def definitions(self, root: str) -> list[tuple[str, str]]:
        """The (name, expression) of the variables the findings read."""
        names = [
            ("Spec", f"{root}.spec"),
            ("Template", f"variables.{self.prefix}Spec.?podTemplate.?spec.orValue({{}})"),
            ("Context", f"{self.template}.?securityContext.orValue({{}})"),
            ("Containers", f"{self.template}.?containers.orValue([])"),
            ("InitContainers", f"{self.template}.?initContainers.orValue([])"),
            ("ContainersNames", f"{self.containers('containers')}.map(c, c.name)"),
            ("InitContainersNames", f"{self.containers('initContainers')}.map(c, c.name)"),
            ("Volumes", f"{self.template}.?volumes.orValue([])"),
            ("Annotations", f"{self.spec}.?podTemplate.?metadata.?annotations.orValue({{}})"),
            ("Trainer", f"{self.containers('containers')}.filter(c, c.name == {literal(TRAINER)})"),
            ("CheckpointVolume", checkpoint_volume_type(self)),
            ("NonRootByOperator", operator_sets_non_root(self)),
        ]
        return [(self.prefix + name, expression) for name, expression in names]


def _per_container(scope: Scope, findings: str, separator: str = "; ") -> str:
    """`findings` (a CEL list of strings over container `c` and its field path `path`) for every
    container, then every init container: one string per container that has any."""
    return concat(
        f"{scope.containers(kind)}.map(c, [{scope.path(kind)}].map(path, "
        f"{findings.replace('PATH', 'path')}.join('{separator}'))[0]).filter(g, g != '')"
        for kind in e.CONTAINER_KINDS
    )


# ----------------------------------------------------------------------------- the baseline's controls


def _host_namespaces(scope: Scope) -> str:
    return concat(
        when(f"{scope.template}.?{field}.orValue(false)", literal(f"{e.TEMPLATE}.{field}=true"))
        for field in ("hostNetwork", "hostPID", "hostIPC")
    )


def _context_findings(path: str, context: str) -> str:
    """`path`: a CEL string; `context`: a securityContext (CEL map)."""
    selinux = f"{context}.?seLinuxOptions"
    lists = [
        when(
            f"{context}.?windowsOptions.?hostProcess.orValue(false)",
            f"{path} + '.windowsOptions.hostProcess=true'",
        ),
        when(
            f"!({selinux}.?type.orValue('') in {strings(e.SELINUX_TYPES)})",
            f"{path} + '.seLinuxOptions.type=' + {context}.seLinuxOptions.type",
        ),
        *(
            when(
                f"{selinux}.?{key}.orValue('') != ''",
                f"{path} + '.seLinuxOptions.{key}=' + {context}.seLinuxOptions.{key}",
            )
            for key in ("user", "role")
        ),
        *(
            when(
                f"!({context}.?{field}.?type.orValue({literal(e.CONFINED_PROFILE_TYPES[0])}) in "
                f"{strings(e.CONFINED_PROFILE_TYPES)})",
                f"{path} + '.{field}.type=' + {context}.{field}.type",
            )
            for field in ("seccompProfile", "appArmorProfile")
        ),
    ]
    return concat(lists)


def _pod_context(scope: Scope) -> str:
    path = f"{e.TEMPLATE}.securityContext"
    sysctls = f"{scope.context}.?sysctls.orValue([])"
    return concat(
        [
            _context_findings(literal(path), scope.context),
            f"{sysctls}.filter(s, !(s.name in {strings(e.SAFE_SYSCTLS)})).map(s, "
            f"'{path}.sysctls[' + string({sysctls}.indexOf(s)) + '].name=' + s.name)",
        ]
    )


def _host_paths(scope: Scope) -> str:
    return (
        f"{scope.volumes}.filter(v, has(v.hostPath)).map(v, "
        f"'{e.TEMPLATE}.volumes[' + string({scope.volumes}.indexOf(v)) + '].hostPath')"
    )


def _container_context() -> str:
    context = "c.?securityContext.orValue({})"
    added = f"{context}.?capabilities.?add.orValue([]).filter(x, !(x in {strings(e.BASELINE_CAPABILITIES)}))"
    return (
        "("
        + concat(
            [
                when(f"{context}.?privileged.orValue(false)", "PATH + '.securityContext.privileged=true'"),
                when(
                    f"{added}.size() > 0", f"PATH + '.securityContext.capabilities.add=' + {added}.join(',')"
                ),
                _context_findings("PATH + '.securityContext'", context),
                when(
                    f"{context}.?procMount.orValue('Default') != 'Default'",
                    "PATH + '.securityContext.procMount=' + c.securityContext.procMount",
                ),
            ]
        )
        + ")"
    )


def _host_ports() -> str:
    """A port's index found by its key (cheaper for CEL than comparing whole ports, and the same: ports
    are a list-map of containerPort and protocol, which the schema defaults)."""
    key = "string({0}.containerPort) + '/' + {0}.?protocol.orValue('TCP')"
    return (
        f"[[c.?ports.orValue([]).map(q, {key.format('q')})].map(keys, "
        "c.?ports.orValue([]).filter(p, p.?hostPort.orValue(0) != 0).map(p, "
        f"PATH + '.ports[' + string(keys.indexOf({key.format('p')})) + '].hostPort=' + string(p.hostPort))"
        ".join(', '))[0]].filter(s, s != '')"
    )


def _handler_hosts() -> str:
    lists = [
        when(
            f"c.?{probe}.?{handler}.?host.orValue('') != ''",
            f"PATH + '.{probe}.{handler}.host=' + c.{probe}.{handler}.host",
        )
        for probe in e.PROBES
        for handler in e.PROBE_HANDLERS
    ]
    lists += [
        when(
            f"c.?lifecycle.?{hook}.?httpGet.?host.orValue('') != ''",
            f"PATH + '.lifecycle.{hook}.httpGet.host=' + c.lifecycle.{hook}.httpGet.host",
        )
        for hook in e.LIFECYCLE_HOOKS
    ]
    return "(" + concat(lists) + ")"


def _apparmor_annotations(scope: Scope) -> str:
    annotations = scope.var("Annotations")
    value = f"{annotations}[k]"
    return (
        f"{annotations}.filter(k, k.startsWith('{e.APPARMOR_ANNOTATION_PREFIX}') && "
        f"!({value} in ['', 'runtime/default'] || {value}.startsWith('localhost/'))).map(k, "
        f"'spec.podTemplate.metadata.annotations[' + k + ']=' + {value})"
    )


def _rdma(scope: Scope) -> str:
    replaced = f"{scope.trainer}.exists(t, t.?securityContext.?capabilities.?add.hasValue())"
    return when(
        f"{scope.spec}.?networking.?rdmaEnabled.orValue(false) && !{replaced}",
        literal("spec.networking.rdmaEnabled=true"),
    )


def pod_escalations(scope: Scope) -> list[str]:
    """The CEL lists whose concatenation is crd/escalation.pod_escalations, over `scope`: one per
    control, each the expression of a variable of its own (each variable has CEL's cost limit per
    expression, so a template with every list at its bound stays within it)."""
    return [
        _host_namespaces(scope),
        _pod_context(scope),
        _host_paths(scope),
        _per_container(scope, _container_context()),
        _per_container(scope, _host_ports()),
        _per_container(scope, _handler_hosts()),
        _apparmor_annotations(scope),
        _rdma(scope),
    ]


# --------------------------------------------------------------------- "restricted", as the pods are built


def checkpoint_volume_type(scope: Scope) -> str:
    checkpoint = f"{scope.spec}.?checkpoint"
    in_use = f"{checkpoint}.?enabled.orValue(false) || {checkpoint}.?resumeFrom.orValue('') != ''"
    kinds = "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in e.CHECKPOINT_VOLUME_TYPES.items()) + "}"
    return f"({in_use}) ? {kinds}[?{checkpoint}.?storage.?type.orValue('pvc')].orValue('') : ''"


def operator_sets_non_root(scope: Scope) -> str:
    spec, volumes = scope.spec, scope.volumes
    commands = "[" + ", ".join(strings(command) for command in contract.NON_ROOT_COMMANDS) + "]"
    allowed = strings(contract.NON_ROOT_VOLUME_TYPES)
    operator_volumes = strings(
        name for name, kind in e.OPERATOR_VOLUME_TYPES.items() if kind in contract.NON_ROOT_VOLUME_TYPES
    )
    writable_ok = (
        f"m.?readOnly.orValue(false) || m.name in {operator_volumes} || "
        f"{volumes}.exists(v, v.name == m.name && {allowed}.exists(k, k in v))"
    )
    checkpoint = scope.var("CheckpointVolume")
    reference_trainer = " &&\n".join(
        [
            f"(!has({spec}.image) || {spec}.image in {strings(contract.NON_ROOT_IMAGES)})",
            f"(!has({spec}.command) || {spec}.command in {commands})",
            f"({checkpoint} == '' || {checkpoint} in {allowed})",
            f"{scope.trainer}.all(t, t.?volumeMounts.orValue([]).all(m, {writable_ok}))",
        ]
    )
    # An MPI job's pods run as an ordinary user whatever their image, command and mounts.
    return " &&\n".join(
        [
            f"!{strings(contract.NON_ROOT_POD_FIELDS)}.exists(f, f in {scope.context})",
            f"!{scope.trainer}.exists(t, {strings(contract.NON_ROOT_CONTAINER_FIELDS)}.exists(f, "
            "f in t.?securityContext.orValue({})))",
            f"({spec}.?framework.orValue('') == 'mpi' || (\n{reference_trainer}))",
        ]
    )


def _restricted_volumes(scope: Scope) -> str:
    kinds = strings(e.UNRESTRICTED_VOLUME_TYPES)
    return concat(
        [
            f"{scope.volumes}.filter(v, {kinds}.exists(k, k in v)).map(v, '{e.TEMPLATE}.volumes[' + "
            f"string({scope.volumes}.indexOf(v)) + '].' + {kinds}.filter(k, k in v).join(','))",
            when(f"{scope.var('CheckpointVolume')} == 'nfs'", literal("spec.checkpoint.storage.type=nfs")),
        ]
    )


def _is_trainer(kind: str) -> str:
    return f"c.name == {literal(TRAINER)}" if kind == "containers" else "false"


def _escalation_and_capabilities(scope: Scope) -> str:
    context = "c.?securityContext"
    escalation = concat(
        f"{scope.containers(kind)}.filter(c, !({context}.?allowPrivilegeEscalation.hasValue() ? "
        f"c.securityContext.allowPrivilegeEscalation == false : "
        f"({_is_trainer(kind)} && {literal(contract.ALLOW_PRIVILEGE_ESCALATION is False)}))).map(c, "
        f"{scope.path(kind)} + '.securityContext.allowPrivilegeEscalation must be false')"
        for kind in e.CONTAINER_KINDS
    )
    addable = [cap for cap in e.BASELINE_CAPABILITIES if cap != e.RESTRICTED_ADDABLE_CAPABILITY]
    added = f"{context}.?capabilities.?add.orValue([]).filter(x, x in {strings(addable)})"
    capabilities = concat(
        f"{scope.containers(kind)}.map(c, ("
        + concat(
            [
                when(
                    f"!('ALL' in {context}.?capabilities.?drop.orValue("
                    f"{_is_trainer(kind)} ? {strings(contract.DROPPED_CAPABILITIES)} : []))",
                    f"{scope.path(kind)} + '.securityContext.capabilities.drop must include ALL'",
                ),
                when(
                    f"{added}.size() > 0",
                    f"{scope.path(kind)} + '.securityContext.capabilities.add=' + {added}.join(',')",
                ),
            ]
        )
        + ").join('; ')).filter(g, g != '')"
        for kind in e.CONTAINER_KINDS
    )
    windows = f"{scope.template}.?os.?name.orValue('') == {literal(e.WINDOWS)}"
    return f"({windows} ? [] : {escalation} +\n{capabilities})"


def _non_root(scope: Scope) -> str:
    path = f"{e.TEMPLATE}.securityContext"
    pod = [
        when(f"{scope.context}.?runAsNonRoot.orValue(true) == false", literal(f"{path}.runAsNonRoot=false")),
        when(f"{scope.context}.?runAsUser.orValue(1) == 0", literal(f"{path}.runAsUser=0")),
    ]
    per_container = _per_container(
        scope,
        "("
        + concat(
            [
                when(
                    "c.?securityContext.?runAsNonRoot.orValue(true) == false",
                    "PATH + '.securityContext.runAsNonRoot=false'",
                ),
                when(
                    "c.?securityContext.?runAsUser.orValue(1) == 0", "PATH + '.securityContext.runAsUser=0'"
                ),
            ]
        )
        + ")",
    )
    by_operator = scope.var("NonRootByOperator")
    unset = concat(
        [
            when(f"{scope.trainer}.size() == 0 && !{by_operator}", literal(TRAINER)),
            *(
                f"{scope.containers(kind)}.filter(c, !c.?securityContext.?runAsNonRoot.hasValue() && "
                f"!({_is_trainer(kind)} && {by_operator})).map(c, c.name)"
                for kind in e.CONTAINER_KINDS
            ),
        ]
    )
    implicit = (
        f"[{unset}].filter(u, {scope.context}.?runAsNonRoot.orValue(false) != true && u.size() > 0).map(u, "
        f"'{path}.runAsNonRoot must be true (unset on ' + u.join(', ') + '; the operator sets it only for "
        "its reference trainer in a framework\\'s default image and for MPI jobs, as it cannot know another "
        "image\\'s user)')"
    )
    return concat([*pod, per_container, implicit])


def restricted_violations(scope: Scope) -> list[str]:
    """The CEL lists of what crd/escalation.pod_security_violations adds for "restricted", one per control."""
    return [_restricted_volumes(scope), _escalation_and_capabilities(scope), _non_root(scope)]
