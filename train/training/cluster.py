"""Which cluster a worker belongs to, when nothing but its place in a Kubernetes Indexed Job says so.

MultiWorkerMirroredStrategy reads TF_CONFIG: every worker's address and this worker's index.
On Kubernetes an Indexed Job (deploy/k8s/trainer.yaml) gives each pod `JOB_COMPLETION_INDEX`
and, under a headless Service named by the pod's `subdomain`, a stable DNS name
`<job>-<index>.<service>.<namespace>.svc`. So the image needs no operator and no per-pod
config: when TF_CONFIG is unset and `TRAINER_WORKERS` is set, `export()` derives TF_CONFIG from

    JOB_COMPLETION_INDEX   this pod's index (set by Kubernetes for Indexed Jobs)
    TRAINER_WORKERS        how many workers (the Job's completions)
    TRAINER_JOB_NAME       the Job's name (the manifest reads it from the pod's job-name label)
    TRAINER_SERVICE        the headless Service (the pods' subdomain)
    TRAINER_NAMESPACE      optional: the namespace (the manifest reads it from the pod), for full names
    TRAINER_PORT           optional: the port every worker listens on (default 2222)
    TRAINER_HOST_MAP       optional, for rehearsals on one machine: {"name:port": "host:port", ...},
                           what /etc/hosts would do if it could also map ports

A TF_CONFIG that is already set always wins, so the same image runs under Kubeflow's TFJob,
a hand-written TF_CONFIG, or `python -m train launch`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, MutableMapping

from train.core.errors import UserError

INDEX = "JOB_COMPLETION_INDEX"
WORKERS = "TRAINER_WORKERS"
JOB_NAME = "TRAINER_JOB_NAME"
SERVICE = "TRAINER_SERVICE"
NAMESPACE = "TRAINER_NAMESPACE"
PORT = "TRAINER_PORT"
HOST_MAP = "TRAINER_HOST_MAP"
DEFAULT_PORT = 2222

# How long a multi-worker run may take from a stop signal to its exit: the steps in flight,
# the chief's checkpoint, and a validation pass when the stop falls on an epoch's end. The
# trainer pods' terminationGracePeriodSeconds must be longer (the manifests' test checks it).
STOP_GRACE_S = 60.0

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def addresses(job: str, service: str, workers: int, port: int = DEFAULT_PORT, namespace: str | None = None) -> list:
    """Every worker's address, as the pods of an Indexed Job under a headless Service are named."""
    domain = f"{service}.{namespace}.svc" if namespace else service
    return [f"{job}-{index}.{domain}:{port}" for index in range(workers)]


def derive(env: Mapping[str, str]) -> dict | None:
    """The TF_CONFIG (as a dict) that `env` describes, or None when it describes none.

    None when TF_CONFIG is set (it wins) or TRAINER_WORKERS is not (not a trainer pod).
    A trainer pod whose variables are missing or malformed is a UserError naming the variable.
    """
    if env.get("TF_CONFIG") or WORKERS not in env:
        return None
    workers = _integer(env, WORKERS, low=1)
    if INDEX not in env:
        raise UserError(
            f"{WORKERS} is set ({env[WORKERS]}) but {INDEX} is not: this worker cannot tell which one it is. "
            "Run the trainer as an Indexed Job (completionMode: Indexed sets it; see deploy/k8s/trainer.yaml), "
            f"set {INDEX} yourself, or set TF_CONFIG instead."
        )
    index = _integer(env, INDEX, low=0)
    if index >= workers:
        raise UserError(
            f"{INDEX}={index} but {WORKERS}={workers}: indexes run from 0 to {workers - 1}. Make {WORKERS} "
            "equal to the Job's completions (make k8s WORKERS=N renders both)."
        )
    job, service = _label(env, JOB_NAME), _label(env, SERVICE)
    namespace = _label(env, NAMESPACE) if env.get(NAMESPACE) else None
    port = _integer(env, PORT, low=1, high=65535) if env.get(PORT) else DEFAULT_PORT
    cluster = addresses(job, service, workers, port, namespace)
    mapping = _host_map(env)
    cluster = [mapping.get(address, address) for address in cluster]
    return {"cluster": {"worker": cluster}, "task": {"type": "worker", "index": index}}


def export(environ: MutableMapping[str, str] = os.environ, log=None) -> dict | None:
    """Set TF_CONFIG in `environ` from the Indexed Job variables (see `derive`); returns it, or None."""
    tf_config = derive(environ)
    if tf_config is None:
        return None
    environ["TF_CONFIG"] = json.dumps(tf_config)
    if log is not None:
        workers = tf_config["cluster"]["worker"]
        log(
            f"TF_CONFIG from {INDEX}={tf_config['task']['index']}: worker {tf_config['task']['index']} of "
            f"{len(workers)} ({', '.join(workers)})"
        )
    return tf_config


def _integer(env: Mapping[str, str], name: str, low: int, high: int | None = None) -> int:
    text = env.get(name, "")
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        limits = f"{low}..{high}" if high is not None else f">= {low}"
        raise UserError(f"{name}={text!r} is not a whole number {limits}. Set it in the trainer's env (deploy/k8s).")
    return value


def _label(env: Mapping[str, str], name: str) -> str:
    value = env.get(name, "")
    if not _DNS_LABEL.match(value):
        raise UserError(
            f"{name}={value!r} is not a DNS label (lower-case letters, digits and '-', at most 63): the workers' "
            f"addresses are built from it. Set it in the trainer's env (deploy/k8s/trainer.yaml)."
        )
    return value


def _host_map(env: Mapping[str, str]) -> dict:
    text = env.get(HOST_MAP)
    if not text:
        return {}
    try:
        mapping = json.loads(text)
    except ValueError:
        mapping = None
    if not isinstance(mapping, dict) or not all(isinstance(v, str) for v in mapping.values()):
        raise UserError(
            f'{HOST_MAP} must be a JSON object of "name:port" -> "host:port" strings, e.g. '
            f'{{"trainer-0.trainer:2222": "localhost:40001"}}; got {text[:200]!r}.'
        )
    return mapping
