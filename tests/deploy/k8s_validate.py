"""Strict validation of Kubernetes manifests without a cluster.

Schema: the object models of the official Kubernetes Python client (the
`kubernetes` package of the project's Python environment, generated from the Kubernetes OpenAPI spec: every field's
JSON name and type, and which fields are required) for core and apps objects,
and the Kubeflow training operator's PyTorchJob v1 Go types, transcribed below
(pkg/apis/kubeflow.org/v1/pytorch_types.go and common_types.go), for the
custom resource. On top of the schema, the rules the API server and the
operator enforce that a schema cannot express: name formats, unique names,
volume mounts naming existing volumes, extended resources with requests ==
limits, a Deployment selector matching its pod labels, the operator's
"container named pytorch" and DNS-1035 job name.

Unknown fields are errors (kubectl's strict field validation would reject
them, and a misspelt field is otherwise silently ignored); so are wrong types
(an env value of 1 instead of "1" is rejected by the API server).

validate(doc) returns a list of "path: problem" strings, empty when valid.
"""

import re

from kubernetes.client import models as k8s_models
from kubernetes.client.configuration import Configuration

DNS1035_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUANTITY = re.compile(r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+|Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)?$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)$")
LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")
IANA_SVC_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
ENV_VAR_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")

# PyTorchJob v1 (kubeflow.org/v1): JSON name -> type, in the client's notation.
CRD_TYPES = {
    "KubeflowPyTorchJob": {"apiVersion": "str", "kind": "str", "metadata": "V1ObjectMeta",
                           "spec": "KubeflowPyTorchJobSpec", "status": "object"},
    "KubeflowPyTorchJobSpec": {"runPolicy": "KubeflowRunPolicy", "elasticPolicy": "KubeflowElasticPolicy",
                               "pytorchReplicaSpecs": "dict(str, KubeflowReplicaSpec)", "nprocPerNode": "str"},
    "KubeflowElasticPolicy": {"minReplicas": "int", "maxReplicas": "int", "rdzvBackend": "str", "rdzvPort": "int",
                              "rdzvHost": "str", "rdzvId": "str", "rdzvConf": "list[KubeflowRDZVConf]",
                              "standalone": "bool", "nProcPerNode": "int", "maxRestarts": "int",
                              "metrics": "list[object]"},
    "KubeflowRDZVConf": {"key": "str", "value": "str"},
    "KubeflowReplicaSpec": {"replicas": "int", "template": "V1PodTemplateSpec", "restartPolicy": "str"},
    "KubeflowRunPolicy": {"cleanPodPolicy": "str", "ttlSecondsAfterFinished": "int", "activeDeadlineSeconds": "int",
                          "backoffLimit": "int", "schedulingPolicy": "KubeflowSchedulingPolicy", "suspend": "bool",
                          "managedBy": "str"},
    "KubeflowSchedulingPolicy": {"minAvailable": "int", "queue": "str", "minResources": "dict(str, quantity)",
                                 "priorityClass": "str", "scheduleTimeoutSeconds": "int"},
}
CRD_REQUIRED = {"KubeflowPyTorchJobSpec": {"pytorchReplicaSpecs"}}

# Fields the Python client types as str/object that Kubernetes types as a
# Quantity (number or string like 64Gi) or an IntOrString.
QUANTITY_FIELDS = {("V1ResourceRequirements", "limits"), ("V1ResourceRequirements", "requests"),
                   ("V1EmptyDirVolumeSource", "sizeLimit")}
ENUMS = {
    ("V1Container", "imagePullPolicy"): {"Always", "IfNotPresent", "Never"},
    ("V1PodSpec", "restartPolicy"): {"Always", "OnFailure", "Never"},
    ("V1EmptyDirVolumeSource", "medium"): {"", "Memory", "HugePages"},
    ("V1ContainerPort", "protocol"): {"TCP", "UDP", "SCTP"},
    ("V1ServicePort", "protocol"): {"TCP", "UDP", "SCTP"},
    ("V1Toleration", "operator"): {"Exists", "Equal"},
    ("V1Toleration", "effect"): {"NoSchedule", "PreferNoSchedule", "NoExecute"},
    ("V1DeploymentStrategy", "type"): {"Recreate", "RollingUpdate"},
    ("V1PersistentVolumeClaimSpec", "accessModes"): {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany",
                                                    "ReadWriteOncePod"},
    ("V1ServiceSpec", "type"): {"ClusterIP", "NodePort", "LoadBalancer", "ExternalName"},
    ("KubeflowReplicaSpec", "restartPolicy"): {"Always", "OnFailure", "Never", "ExitCode"},
    ("KubeflowElasticPolicy", "rdzvBackend"): {"c10d", "etcd", "etcd-v2"},
    ("KubeflowRunPolicy", "cleanPodPolicy"): {"All", "Running", "None"},
}

_required_cache = {}


def _normalize_type(t):
    """The client's type names in one spelling: newer clients (pydantic models) write
    'List[X]' and 'Dict[str, X]' where older ones wrote 'list[X]' and 'dict(str, X)'."""
    t = t.strip()
    if t.startswith("List[") and t.endswith("]"):
        return f"list[{_normalize_type(t[5:-1])}]"
    if t.startswith("Dict[") and t.endswith("]"):
        key, value = t[5:-1].split(",", 1)
        return f"dict({key.strip()}, {_normalize_type(value)})"
    return t


def _client_fields(name):
    """JSON name -> (type, python attribute) of a Kubernetes client model."""
    cls = getattr(k8s_models, name)
    return {json: (_normalize_type(cls.openapi_types[attr]), attr) for attr, json in cls.attribute_map.items()}


def _client_required(name):
    """JSON names of the required fields: pydantic models (newer clients) say so in
    model_fields; older clients' setters reject None for them."""
    if name not in _required_cache:
        cls = getattr(k8s_models, name)
        required = set()
        if hasattr(cls, "model_fields"):
            # attribute_map's keys are the fields' aliases where they have one ('_exec' for var_exec).
            by_attr = {f.alias or name: f for name, f in cls.model_fields.items()}
            for attr, json in cls.attribute_map.items():
                if by_attr[attr].is_required():
                    required.add(json)
        else:
            inst = cls.__new__(cls)
            inst.local_vars_configuration = Configuration()
            for attr, json in cls.attribute_map.items():
                try:
                    setattr(inst, attr, None)
                except ValueError:
                    required.add(json)
        _required_cache[name] = required
    return _required_cache[name]


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _check_type(value, type_name, path, errors, owner=None, field=None):
    if value is None:
        return  # null is "unset" for optional fields; required ones are checked by the owner
    if (owner, field) in QUANTITY_FIELDS or type_name == "quantity":
        if type_name.startswith("dict("):
            if not isinstance(value, dict):
                errors.append(f"{path}: expected a map of quantities, got {type(value).__name__}")
                return
            for k, v in value.items():
                _check_quantity(v, f"{path}.{k}", errors)
        else:
            _check_quantity(value, path, errors)
        return
    if type_name.startswith("list["):
        if not isinstance(value, list):
            errors.append(f"{path}: expected a list, got {type(value).__name__}")
            return
        for i, item in enumerate(value):
            _check_type(item, type_name[5:-1], f"{path}[{i}]", errors, owner, field)
        return
    if type_name.startswith("dict("):
        if not isinstance(value, dict):
            errors.append(f"{path}: expected a map, got {type(value).__name__}")
            return
        inner = type_name[5:-1].split(", ", 1)[1]
        for k, v in value.items():
            if not isinstance(k, str):
                errors.append(f"{path}: map key {k!r} is not a string")
            _check_type(v, inner, f"{path}.{k}", errors)
        return
    if type_name == "str":
        if not isinstance(value, str):
            errors.append(f"{path}: expected a string, got {type(value).__name__} {value!r}")
        elif (owner, field) in ENUMS and value not in ENUMS[(owner, field)]:
            errors.append(f"{path}: '{value}' is not one of {sorted(ENUMS[(owner, field)])}")
        return
    if type_name == "int":
        if not _is_int(value):
            errors.append(f"{path}: expected an integer, got {type(value).__name__} {value!r}")
        return
    if type_name == "float":
        if not (_is_int(value) or isinstance(value, float)):
            errors.append(f"{path}: expected a number, got {type(value).__name__} {value!r}")
        return
    if type_name == "bool":
        if not isinstance(value, bool):
            errors.append(f"{path}: expected true or false, got {value!r}")
        return
    if type_name == "object":  # IntOrString or free-form
        if field in ("port", "targetPort") and not (_is_int(value) or isinstance(value, str)):
            errors.append(f"{path}: expected a port number or name, got {value!r}")
        return
    if type_name == "datetime":
        if not isinstance(value, str):
            errors.append(f"{path}: expected a timestamp string")
        return
    _check_object(value, type_name, path, errors)


def _check_quantity(value, path, errors):
    if _is_int(value) or isinstance(value, float):
        return
    if not isinstance(value, str) or not QUANTITY.match(value):
        errors.append(f"{path}: {value!r} is not a quantity (like 8, 500m, 64Gi)")


def _check_object(value, type_name, path, errors):
    if not isinstance(value, dict):
        errors.append(f"{path}: expected an object ({type_name}), got {type(value).__name__}")
        return
    if type_name in CRD_TYPES:
        fields = {k: (t, k) for k, t in CRD_TYPES[type_name].items()}
        required = CRD_REQUIRED.get(type_name, set())
    else:
        fields = _client_fields(type_name)
        required = _client_required(type_name)
    for key, sub in value.items():
        if key not in fields:
            errors.append(f"{path}: unknown field '{key}' in {type_name}")
            continue
        _check_type(sub, fields[key][0], f"{path}.{key}", errors, type_name, key)
    for key in sorted(required):
        if value.get(key) is None:
            errors.append(f"{path}: required field '{key}' of {type_name} is missing")


# ---- rules beyond the schema --------------------------------------------------

def _name_rule(name, pattern, what, path, errors, max_len=63):
    if not isinstance(name, str) or len(name) > max_len or not pattern.match(name):
        errors.append(f"{path}: '{name}' is not a valid {what}")


def _check_labels(labels, path, errors):
    for k, v in (labels or {}).items():
        prefix, _, name = k.rpartition("/")
        if (prefix and (len(prefix) > 253 or not DNS1123_SUBDOMAIN.match(prefix))) or \
                len(name) > 63 or not LABEL_NAME.match(name):
            errors.append(f"{path}: label key '{k}' is invalid")
        if not isinstance(v, str) or len(v) > 63 or not LABEL_VALUE.match(v):
            errors.append(f"{path}: label value {v!r} of '{k}' is invalid")


def _check_metadata(meta, name_pattern, name_what, path, errors, max_len=63):
    if not isinstance(meta, dict):
        return
    _name_rule(meta.get("name"), name_pattern, name_what, f"{path}.name", errors, max_len)
    if "namespace" in meta:
        _name_rule(meta["namespace"], DNS1123_LABEL, "namespace (DNS-1123 label)", f"{path}.namespace", errors)
    _check_labels(meta.get("labels"), f"{path}.labels", errors)


def _check_pod_spec(spec, path, errors, restart_policies=None):
    if not isinstance(spec, dict):
        return
    _check_labels(spec.get("nodeSelector"), f"{path}.nodeSelector", errors)
    volumes = set()
    for i, v in enumerate(spec.get("volumes") or []):
        name = v.get("name")
        _name_rule(name, DNS1123_LABEL, "volume name (DNS-1123 label)", f"{path}.volumes[{i}].name", errors)
        if name in volumes:
            errors.append(f"{path}.volumes[{i}]: duplicate volume name '{name}'")
        volumes.add(name)
        sources = [k for k in v if k != "name"]
        if len(sources) != 1:
            errors.append(f"{path}.volumes[{i}]: needs exactly one volume source, has {sources}")
    if restart_policies and spec.get("restartPolicy") not in (None, *restart_policies):
        errors.append(f"{path}.restartPolicy: must be one of {restart_policies}")
    names = set()
    for i, c in enumerate(spec.get("containers") or []):
        cp = f"{path}.containers[{i}]"
        _name_rule(c.get("name"), DNS1123_LABEL, "container name (DNS-1123 label)", f"{cp}.name", errors)
        if c.get("name") in names:
            errors.append(f"{cp}: duplicate container name '{c.get('name')}'")
        names.add(c.get("name"))
        if not c.get("image"):
            errors.append(f"{cp}.image: required")
        env_names = set()
        for j, e in enumerate(c.get("env") or []):
            n = e.get("name")
            if not isinstance(n, str) or not ENV_VAR_NAME.match(n):
                errors.append(f"{cp}.env[{j}].name: '{n}' is not a valid variable name")
            if n in env_names:
                errors.append(f"{cp}.env[{j}]: duplicate variable '{n}'")
            env_names.add(n)
            if "value" in e and "valueFrom" in e:
                errors.append(f"{cp}.env[{j}]: value and valueFrom are exclusive")
        mounts = set()
        for j, m in enumerate(c.get("volumeMounts") or []):
            if m.get("name") not in volumes:
                errors.append(f"{cp}.volumeMounts[{j}]: volume '{m.get('name')}' is not in the pod's volumes")
            mp = m.get("mountPath")
            if not isinstance(mp, str) or not mp.startswith("/"):
                errors.append(f"{cp}.volumeMounts[{j}].mountPath: '{mp}' must be an absolute path")
            if mp in mounts:
                errors.append(f"{cp}.volumeMounts[{j}]: duplicate mountPath '{mp}'")
            mounts.add(mp)
        port_names = set()
        for j, p in enumerate(c.get("ports") or []):
            if "name" in p:
                _name_rule(p["name"], IANA_SVC_NAME, "port name (IANA_SVC_NAME, <= 15 characters)",
                           f"{cp}.ports[{j}].name", errors, 15)
                port_names.add(p["name"])
            if not _is_int(p.get("containerPort")) or not 1 <= p["containerPort"] <= 65535:
                errors.append(f"{cp}.ports[{j}].containerPort: must be 1-65535")
        for probe in ("readinessProbe", "livenessProbe", "startupProbe"):
            port = ((c.get(probe) or {}).get("httpGet") or {}).get("port")
            if isinstance(port, str) and port not in port_names:
                errors.append(f"{cp}.{probe}.httpGet.port: no container port named '{port}'")
        _check_resources(c.get("resources") or {}, f"{cp}.resources", errors)


def _quantity_value(q):
    if not isinstance(q, str):
        return float(q)
    suffixes = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
                "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
    for s, mult in suffixes.items():
        if q.endswith(s) and not q.endswith("e" + s):
            return float(q[:-len(s)]) * mult
    return float(q)


def _check_resources(res, path, errors):
    requests, limits = res.get("requests") or {}, res.get("limits") or {}
    for name in set(requests) | set(limits):
        native = "/" not in name or name.split("/")[0].endswith("kubernetes.io")
        try:
            req = _quantity_value(requests[name]) if name in requests else None
            lim = _quantity_value(limits[name]) if name in limits else None
        except (TypeError, ValueError):
            continue  # reported by the schema check
        if req is not None and lim is not None and req > lim:
            errors.append(f"{path}: request {requests[name]} of {name} exceeds its limit {limits[name]}")
        if not native:
            # Extended resources cannot be overcommitted (API server validation).
            if req is not None and lim is not None and req != lim:
                errors.append(f"{path}: extended resource {name} needs requests == limits "
                              f"({requests[name]} != {limits[name]})")
            if req is None and lim is None or any(x is not None and x != int(x) for x in (req, lim)):
                errors.append(f"{path}: extended resource {name} must be a whole number")


def validate(doc):
    errors = []
    if not isinstance(doc, dict):
        return ["document is not a mapping"]
    api, kind = doc.get("apiVersion"), doc.get("kind")
    meta = doc.get("metadata")
    if not isinstance(meta, dict) or "name" not in meta:
        errors.append("metadata.name: required")
    if (api, kind) == ("kubeflow.org/v1", "PyTorchJob"):
        _check_object(doc, "KubeflowPyTorchJob", "", errors)
        # The training operator rejects names that are not DNS-1035 labels.
        _check_metadata(meta, DNS1035_LABEL, "PyTorchJob name (DNS-1035 label)", "metadata", errors)
        spec = doc.get("spec") or {}
        specs = spec.get("pytorchReplicaSpecs") or {}
        for rtype, rs in specs.items():
            rp = f"spec.pytorchReplicaSpecs.{rtype}"
            if rtype not in ("Master", "Worker"):
                errors.append(f"{rp}: replica type must be Master or Worker")
            if not isinstance(rs, dict):
                continue
            tmpl = rs.get("template") or {}
            pod = tmpl.get("spec") or {}
            if not pod.get("containers"):
                errors.append(f"{rp}.template.spec.containers: required")
            elif "pytorch" not in [c.get("name") for c in pod["containers"]]:
                errors.append(f"{rp}.template.spec.containers: the operator needs a container named 'pytorch'")
            if rtype == "Master" and rs.get("replicas") not in (None, 1):
                errors.append(f"{rp}.replicas: there must be exactly one Master")
            _check_labels((tmpl.get("metadata") or {}).get("labels"), f"{rp}.template.metadata.labels", errors)
            _check_pod_spec(pod, f"{rp}.template.spec", errors)
        ep = spec.get("elasticPolicy")
        if isinstance(ep, dict):
            lo, hi = ep.get("minReplicas"), ep.get("maxReplicas")
            if _is_int(lo) and _is_int(hi) and lo > hi:
                errors.append(f"spec.elasticPolicy: minReplicas {lo} > maxReplicas {hi}")
            if spec.get("nprocPerNode") is not None and ep.get("nProcPerNode") is not None:
                errors.append("spec: elasticPolicy.nProcPerNode and nprocPerNode are exclusive (operator rule)")
            port = ep.get("rdzvPort")
            if port is not None and not (_is_int(port) and 1 <= port <= 65535):
                errors.append(f"spec.elasticPolicy.rdzvPort: {port!r} is not a port")
    elif (api, kind) == ("v1", "Service"):
        _check_object(doc, "V1Service", "", errors)
        _check_metadata(meta, DNS1035_LABEL, "Service name (DNS-1035 label)", "metadata", errors)
        for i, p in enumerate((doc.get("spec") or {}).get("ports") or []):
            if "name" in p:
                _name_rule(p["name"], IANA_SVC_NAME, "port name", f"spec.ports[{i}].name", errors, 15)
            if not _is_int(p.get("port")) or not 1 <= p["port"] <= 65535:
                errors.append(f"spec.ports[{i}].port: must be 1-65535")
    elif (api, kind) == ("apps/v1", "Deployment"):
        _check_object(doc, "V1Deployment", "", errors)
        _check_metadata(meta, DNS1123_SUBDOMAIN, "Deployment name (DNS-1123 subdomain)", "metadata", errors, 253)
        spec = doc.get("spec") or {}
        tmpl = spec.get("template") or {}
        labels = (tmpl.get("metadata") or {}).get("labels") or {}
        match = ((spec.get("selector") or {}).get("matchLabels")) or {}
        if not match or any(labels.get(k) != v for k, v in match.items()):
            errors.append("spec.selector.matchLabels: must be non-empty and match spec.template.metadata.labels")
        _check_labels(labels, "spec.template.metadata.labels", errors)
        _check_pod_spec(tmpl.get("spec") or {}, "spec.template.spec", errors, restart_policies=("Always",))
    elif (api, kind) == ("v1", "PersistentVolumeClaim"):
        _check_object(doc, "V1PersistentVolumeClaim", "", errors)
        _check_metadata(meta, DNS1123_SUBDOMAIN, "claim name (DNS-1123 subdomain)", "metadata", errors, 253)
        spec = doc.get("spec") or {}
        if not spec.get("accessModes"):
            errors.append("spec.accessModes: required")
        if "storage" not in ((spec.get("resources") or {}).get("requests") or {}):
            errors.append("spec.resources.requests.storage: required")
    else:
        errors.append(f"unexpected apiVersion/kind {api}/{kind}")
    return errors
