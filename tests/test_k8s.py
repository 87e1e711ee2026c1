"""Kubernetes: the manifests of deploy/k8s/ rendered and validated offline, and checked for what the
schemas cannot see; TF_CONFIG derived from a pod's index; the trainer pods rehearsed on this machine
the way the manifests start them (with a tf.data service); one worker preempted at three steps.

The rehearsals start real local processes from the rendered manifests: each gets the container's
args and the env the kubelet would give it (JOB_COMPLETION_INDEX, values, the downward API's
fields), with the cluster's DNS names mapped to localhost ports (TRAINER_HOST_MAP for the trainer's
own cluster, the same mapping applied to addresses in the args). Every wait is bounded, and every
process is killed at the end, even when a worker dies.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT, data_sets, run_cli
from train.cli import k8s, lint
from train.core.errors import UserError
from train.training import checkpoint, cluster
from train.training.launch import free_ports

NAMESPACE = "default"
QUICK = [
    "profile.enabled=false",
    "monitor.enabled=false",
    "model.name=tiny",
    "model.width=4",
    "train.precision=float32",
    "train.deterministic=true",
    "pipeline.shuffle_buffer=16",
    "pipeline.batch_size=8",
    "train.collective_timeout_s=30",
]


# --- the manifests as Kubernetes would read them --------------------------------------------------


def trainer_parts(manifests: dict) -> tuple[dict, dict, dict]:
    """(the trainer Job, its pod spec, its container)."""
    job = k8s.find(manifests, "Job", k8s.TRAINER)
    return job, job["spec"]["template"]["spec"], k8s.containers(job)[0]


def pod_names(manifests: dict) -> list[str]:
    """The DNS names Kubernetes gives an Indexed Job's pods under the headless Service of their subdomain
    (<job>-<index>.<subdomain>.<namespace>.svc), read from the manifests, not from cluster.py."""
    job, spec, container = trainer_parts(manifests)
    port = container["ports"][0]["containerPort"]
    name, subdomain = job["metadata"]["name"], spec["subdomain"]
    return [f"{name}-{index}.{subdomain}.{NAMESPACE}.svc:{port}" for index in range(job["spec"]["completions"])]


def expand(text: str, env: dict) -> str:
    """Kubernetes' $(VAR) expansion in args and env values."""
    return re.sub(r"\$\((\w+)\)", lambda match: env.get(match.group(1), match.group(0)), text)


def pod_env(workload: dict, container: dict, index: int | None = None, pod_ip: str = "localhost") -> dict:
    """The env the kubelet gives `container` of a pod of `workload` (a Job or Deployment)."""
    env = {"JOB_COMPLETION_INDEX": str(index)} if index is not None else {}
    labels = dict(workload["spec"]["template"]["metadata"].get("labels", {}))
    if workload["kind"] == "Job":  # the Job controller labels its pods with the Job's name
        labels["batch.kubernetes.io/job-name"] = labels["job-name"] = workload["metadata"]["name"]
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = expand(item["value"], env)
            continue
        path = item["valueFrom"]["fieldRef"]["fieldPath"]
        label = re.fullmatch(r"metadata\.labels\['(.+)'\]", path)
        fields = {"metadata.namespace": NAMESPACE, "status.podIP": pod_ip}
        env[item["name"]] = labels[label.group(1)] if label else fields[path]
    return env


def pod_command(container: dict, env: dict, hosts: dict, ports: dict | None = None, mounts: dict | None = None):
    """The container's args as this machine runs them: names mapped to local addresses, container ports
    to local ports (each pod has its own network, local processes share one), mount paths to folders."""
    args = [expand(arg, env) for arg in container["args"]]
    for name, local in hosts.items():
        args = [arg.replace(name, local) for arg in args]
    for index, arg in enumerate(args[:-1]):
        if arg == "--port" and int(args[index + 1]) in (ports or {}):
            args[index + 1] = str(ports[int(args[index + 1])])
    for path, local in (mounts or {}).items():
        args = [str(local) + arg[len(path) :] if arg == path or arg.startswith(path + "/") else arg for arg in args]
    assert args[:3] == ["python", "-m", "train"], args
    return [sys.executable, *args[1:]]


def base_env() -> dict:
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG" and not key.startswith("TRAINER_")}
    return {**env, "PYTHONPATH": str(ROOT)}


class Processes:
    """Local processes with their output in files (no pipe fills up); all killed at the end."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.started: list[subprocess.Popen] = []

    def start(self, name: str, command: list[str], env: dict) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")
        process = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        process.log = self.folder / f"{name}.log"
        log.close()
        self.started.append(process)
        return process

    def wait_for(self, process: subprocess.Popen, text: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while text not in output(process):
            assert process.poll() is None, (
                f"{process.log.name} exited ({process.returncode}):\n{output(process)[-3000:]}"
            )
            assert time.monotonic() < deadline, f"no {text!r} in {process.log.name}:\n{output(process)[-3000:]}"
            time.sleep(0.05)

    def kill_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=30)


def output(process: subprocess.Popen) -> str:
    return process.log.read_text(errors="replace")


def wait_all(processes: list[subprocess.Popen], timeout: float) -> float:
    """Seconds until every process exited; fails the test after `timeout`."""
    started = time.monotonic()
    for process in processes:
        try:
            process.wait(timeout=max(0.1, started + timeout - time.monotonic()))
        except subprocess.TimeoutExpired:
            pytest.fail(f"{process.log.name} still runs after {timeout:g} s:\n{output(process)[-3000:]}")
    return time.monotonic() - started


@pytest.fixture
def processes(tmp_path):
    started = Processes(tmp_path)
    yield started
    started.kill_all()


def start_trainers(processes, manifests, name: str, overrides: list[str], hosts: dict) -> list[subprocess.Popen]:
    """One process per trainer pod: the manifest's args and env, its index, the names mapped locally."""
    job, _, container = trainer_parts(manifests)
    own = {address: hosts[address] for address in pod_names(manifests)}
    pods = []
    for index in range(job["spec"]["completions"]):
        env = {**base_env(), **pod_env(job, container, index), cluster.HOST_MAP: json.dumps(own)}
        command = pod_command(container, env, hosts) + [arg for item in overrides for arg in ("--set", item)]
        pods.append(processes.start(f"{name}-{index}", command, env))
    return pods


# --- rendered and validated ---------------------------------------------------------------------------


@pytest.mark.slow
def test_rendered_manifests_pass_the_api_schemas_of_the_three_newest_kubernetes_versions():
    from kubernetes_validate.utils import all_versions

    bundled = {".".join(version.split(".")[:2]) for version in all_versions()}
    assert set(lint.KUBERNETES_VERSIONS) <= bundled
    assert (
        sorted(lint.KUBERNETES_VERSIONS, key=lambda v: tuple(map(int, v.split("."))))
        == sorted(bundled, key=lambda v: tuple(map(int, v.split("."))))[-3:]
    )
    assert lint.kubernetes_manifests() == []


def test_schema_validation_catches_a_misspelt_field(monkeypatch):
    templates = k8s.load_templates()
    job = k8s.find(templates, "Job", k8s.TRAINER)
    job["spec"]["completionsMode"] = job["spec"].pop("completionMode")
    monkeypatch.setattr(k8s, "load_templates", lambda folder=None: templates)
    problems = lint.kubernetes_manifests(versions=("1.37",))
    assert problems and all("completionsMode" in problem for problem in problems)
    assert any("Job/gpu-template-trainer Kubernetes 1.37" in problem for problem in problems)


def test_the_trainer_job_is_what_preemption_and_multi_worker_training_need():
    manifests = k8s.render(k8s.Options(workers=3, gpus_per_worker=2))
    job, spec, container = trainer_parts(manifests)
    service = k8s.find(manifests, "Service", k8s.TRAINER)
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    assert pod_env(job, container, 0)[cluster.WORKERS] == "3"
    # DNS names for the pods: a headless Service named as their subdomain, selecting exactly them
    assert service["spec"]["clusterIP"] == "None" and spec["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == {"batch.kubernetes.io/job-name": job["metadata"]["name"]}
    assert pod_env(job, container, 0)[cluster.SERVICE] == spec["subdomain"]
    assert int(pod_env(job, container, 0)[cluster.PORT]) == container["ports"][0]["containerPort"]
    # preemption restarts (143 and DisruptionTarget are not counted), config errors fail at once
    assert spec["restartPolicy"] == "Never" and job["spec"]["podReplacementPolicy"] == "Failed"
    rules = {
        (rule["action"], tuple(rule["onExitCodes"]["values"])) if "onExitCodes" in rule else (rule["action"], None)
        for rule in job["spec"]["podFailurePolicy"]["rules"]
    }
    assert rules == {("FailJob", (2,)), ("Ignore", (143,)), ("Ignore", None)}
    for rule in job["spec"]["podFailurePolicy"]["rules"]:
        if "onExitCodes" in rule:
            assert rule["onExitCodes"]["operator"] == "In" and rule["onExitCodes"]["containerName"] == container["name"]
        else:
            assert rule["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    assert spec["terminationGracePeriodSeconds"] > cluster.STOP_GRACE_S + 15
    assert spec["shareProcessNamespace"] is True  # the trainer is not PID 1: it gets ordinary signals
    # GPUs, /dev/shm, the volumes
    assert container["resources"]["requests"][k8s.GPU] == container["resources"]["limits"][k8s.GPU] == 2
    volumes = {volume["name"]: volume for volume in spec["volumes"]}
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    claims = {doc["metadata"]["name"]: doc for doc in manifests["storage.yaml"]}
    for path in ("/workspace/template/shards", "/workspace/template/runs"):
        claim = volumes[mounts[path]]["persistentVolumeClaim"]["claimName"]
        assert claims[claim]["spec"]["accessModes"] == ["ReadWriteMany"]
    assert "train.strategy=multi_worker" in container["args"]


def test_the_data_service_tensorboard_and_dataset_job_are_wired_to_each_other():
    manifests = k8s.render(k8s.Options(data_workers=5))
    _, _, trainer = trainer_parts(manifests)
    dispatcher = k8s.find(manifests, "Service", "gpu-template-data-dispatcher")
    address = f"{dispatcher['metadata']['name']}:{dispatcher['spec']['ports'][0]['port']}"
    assert f"pipeline.data_service=grpc://{address}" in trainer["args"]
    workers = k8s.find(manifests, "Deployment", k8s.DATA_WORKER)
    assert workers["spec"]["replicas"] == 5
    worker = k8s.containers(workers)[0]
    assert worker["args"][worker["args"].index("--dispatcher") + 1] == address
    assert worker["args"][worker["args"].index("--advertise") + 1] == "$(POD_IP)"
    dispatch = k8s.find(manifests, "Deployment", "gpu-template-data-dispatcher")
    assert dispatch["spec"]["replicas"] == 1 and dispatch["spec"]["strategy"]["type"] == "Recreate"
    args = k8s.containers(dispatch)[0]["args"]
    journal = args[args.index("--work-dir") + 1]
    assert {m["mountPath"]: m["name"] for m in k8s.containers(dispatch)[0]["volumeMounts"]}[journal] == "journal"
    board = k8s.find(manifests, "Deployment", "gpu-template-tensorboard")
    mount = k8s.containers(board)[0]["volumeMounts"][0]
    assert mount["mountPath"] == "/workspace/template/runs" and mount["readOnly"]
    dataset = k8s.containers(k8s.find(manifests, "Job", "gpu-template-dataset"))[0]
    assert dataset["args"][3] == "data" and dataset["volumeMounts"][0]["mountPath"] == "/workspace/template/shards"
    # the dataset is built with the trainer's config: the same data.* keys, so the same shards
    assert (
        dataset["args"][dataset["args"].index("--config") + 1] == trainer["args"][trainer["args"].index("--config") + 1]
    )

    alone = k8s.render(k8s.Options(data_workers=0, gpus_per_worker=0))
    assert "data-service.yaml" not in alone
    _, spec, trainer = trainer_parts(alone)
    assert not any("data_service" in arg for arg in trainer["args"]) and "--set" != trainer["args"][-1]
    assert k8s.GPU not in trainer["resources"]["requests"] and "tolerations" not in spec


def test_make_k8s_writes_the_manifests_for_an_image_and_a_worker_count(tmp_path):
    out = tmp_path / "rendered"
    result = run_cli(
        "k8s", "--image", "registry.example.com/gpu-template:v1", "--workers", "3", "--set", "train.epochs=3",
        "--out", str(out), timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert sorted(path.name for path in out.iterdir()) == sorted(k8s.ORDER)
    manifests = {path.name: list(yaml.safe_load_all(path.read_text())) for path in out.iterdir()}
    images = {c["image"] for docs in manifests.values() for doc in docs for c in k8s.containers(doc)}
    assert images == {"registry.example.com/gpu-template:v1"}
    job, _, container = trainer_parts(manifests)
    assert job["spec"]["completions"] == 3 and container["args"][-2:] == ["--set", "train.epochs=3"]
    assert (
        "python -m train k8s --image registry.example.com/gpu-template:v1 --workers 3"
        in (out / "trainer.yaml").read_text()
    )
    again = run_cli("k8s", "--workers", "2", "--data-workers", "0", "--out", str(out), timeout=60)
    assert again.returncode == 0 and not (out / "data-service.yaml").exists()
    bad = run_cli("k8s", "--workers", "0", "--image", "two words", "--out", str(tmp_path / "bad"), timeout=60)
    assert bad.returncode == 2 and "--workers must be at least 1" in bad.stderr and "--image" in bad.stderr
    assert not (tmp_path / "bad").exists()


# --- TF_CONFIG from the pod's index ---------------------------------------------------------------------


def test_tf_config_is_derived_from_the_pods_index_and_the_services_names():
    manifests = k8s.render(k8s.Options(workers=3))
    job, _, container = trainer_parts(manifests)
    names = [f"gpu-template-trainer-{index}.gpu-template-trainer.default.svc:2222" for index in range(3)]
    assert pod_names(manifests) == names
    for index in range(3):
        derived = cluster.derive(pod_env(job, container, index))
        assert derived == {"cluster": {"worker": names}, "task": {"type": "worker", "index": index}}
    env = pod_env(job, container, 1)
    assert cluster.derive({**env, "TF_CONFIG": '{"cluster": {}}'}) is None  # a TF_CONFIG that is set wins
    assert cluster.derive({"JOB_COMPLETION_INDEX": "0"}) is None  # someone else's Indexed Job
    mapped = {names[0]: "localhost:1000", names[1]: "localhost:1001"}
    derived = cluster.derive({**env, cluster.HOST_MAP: json.dumps(mapped)})
    assert derived["cluster"]["worker"] == ["localhost:1000", "localhost:1001", names[2]]
    short = {key: value for key, value in env.items() if key not in (cluster.NAMESPACE, cluster.PORT)}
    assert cluster.derive(short)["cluster"]["worker"][0] == "gpu-template-trainer-0.gpu-template-trainer:2222"
    environ = dict(env)
    assert cluster.export(environ) == cluster.derive(env) and json.loads(environ["TF_CONFIG"])["task"]["index"] == 1


@pytest.mark.parametrize(
    "change, words",
    [
        ({"JOB_COMPLETION_INDEX": None}, "JOB_COMPLETION_INDEX is not"),
        ({"JOB_COMPLETION_INDEX": "2"}, "indexes run from 0 to 1"),
        ({"TRAINER_WORKERS": "two"}, "TRAINER_WORKERS='two' is not a whole number"),
        ({"TRAINER_JOB_NAME": "Trainer_0"}, "TRAINER_JOB_NAME='Trainer_0' is not a DNS label"),
        ({"TRAINER_PORT": "99999"}, "TRAINER_PORT='99999'"),
        ({"TRAINER_HOST_MAP": "[1]"}, "TRAINER_HOST_MAP must be a JSON object"),
    ],
)
def test_a_pod_with_a_broken_env_is_a_config_error_naming_the_variable(change, words):
    job, _, container = trainer_parts(k8s.render(k8s.Options()))
    env = pod_env(job, container, 0)
    for key, value in change.items():
        if value is None:
            env.pop(key)
        else:
            env[key] = value
    with pytest.raises(UserError, match=re.escape(words)):
        cluster.derive(env)


def test_the_trainer_exits_2_on_a_broken_pod_env_so_the_job_fails_at_once():
    job, _, container = trainer_parts(k8s.render(k8s.Options()))
    env = {**base_env(), **pod_env(job, container, 5)}
    result = subprocess.run(
        pod_command(container, env, {}), cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2, result.stderr[-2000:]  # podFailurePolicy: FailJob
    assert "JOB_COMPLETION_INDEX=5 but TRAINER_WORKERS=2" in result.stderr


# --- rehearsed on this machine ----------------------------------------------------------------------------


@pytest.mark.long
@pytest.mark.timeout(600)
def test_the_pods_rehearsed_locally_train_to_identical_weights_and_stop_when_the_data_service_is_lost(
    tiny_data_dir, tmp_path, processes
):
    """Two trainer pods, a dispatcher and a data-service worker, started from the rendered manifests; then
    the data-service worker is lost and the trainers' stall watchdog ends them with a clear error."""
    manifests = k8s.render(k8s.Options(workers=2, data_workers=1, gpus_per_worker=0))
    ports = iter(free_ports(5))
    hosts = {address: f"localhost:{next(ports)}" for address in pod_names(manifests)}
    service = k8s.find(manifests, "Service", "gpu-template-data-dispatcher")
    service_port = service["spec"]["ports"][0]["port"]
    hosts[f"{service['metadata']['name']}:{service_port}"] = dispatcher_address = f"localhost:{next(ports)}"
    dispatch = k8s.find(manifests, "Deployment", "gpu-template-data-dispatcher")
    container = k8s.containers(dispatch)[0]
    env = {**base_env(), **pod_env(dispatch, container)}
    journal = tmp_path / "journal"
    own_port = {container["ports"][0]["containerPort"]: int(dispatcher_address.split(":")[1])}
    dispatcher = processes.start("dispatcher", pod_command(container, env, hosts, own_port, {"/journal": journal}), env)
    processes.wait_for(dispatcher, "tf.data service dispatcher: grpc://")
    workers = k8s.find(manifests, "Deployment", k8s.DATA_WORKER)
    container = k8s.containers(workers)[0]
    env = {**base_env(), **pod_env(workers, container)}
    own_port = {container["ports"][0]["containerPort"]: next(ports)}
    data_worker = processes.start("data-worker", pod_command(container, env, hosts, own_port), env)
    processes.wait_for(data_worker, "tf.data service worker localhost:")

    runs = tmp_path / "runs"
    overrides = data_sets(tiny_data_dir) + QUICK + [f"runs_dir={runs}", "train.epochs=2"]
    pods = start_trainers(processes, manifests, "trainer", overrides, hosts)
    wait_all(pods, 300)
    for index, pod in enumerate(pods):
        assert pod.returncode == 0, output(pod)[-3000:]
        assert f"TF_CONFIG from JOB_COMPLETION_INDEX={index}: worker {index} of 2 (localhost:" in output(pod)
    run_dir = runs / "optimized"
    fingerprints = {json.loads(path.read_text())["weights_sha256"] for path in (run_dir / "workers").glob("*.json")}
    summary = json.loads((run_dir / "summary.json").read_text())
    assert len(fingerprints) == 1 and summary["weights_sha256"] in fingerprints
    assert summary["workers"] == 2 and "tf.data service" in summary["pipeline"]
    assert any(journal.iterdir()), "the dispatcher journals into its volume"

    stall = overrides + ["train.epochs=500", "train.stall_timeout_s=10"]
    pods = start_trainers(processes, manifests, "stalled", [*stall, "checkpoint.every_epochs=1"], hosts)
    processes.wait_for(pods[0], "epoch 1/500")
    data_worker.kill()
    wait_all(pods, 120)
    assert [pod.returncode for pod in pods] == [3, 3], [output(pod)[-2000:] for pod in pods]
    assert any("no training step finished for 10 s" in output(pod) for pod in pods)
    assert checkpoint.latest(run_dir) is not None  # kept: a restart resumes


def damaged_copy(tiny_data_dir: Path, tmp_path: Path) -> Path:
    from tests.test_reliability import copy_dataset, damage

    copy, spec = copy_dataset(tiny_data_dir, tmp_path)
    damage(spec.train_files[0], "bitflip")  # worker 0 reads shards 0 and 2
    return copy


@pytest.mark.long
@pytest.mark.timeout(900)
def test_preempting_one_worker_at_three_steps_stops_all_and_resumes_to_the_uninterrupted_weights(
    tiny_data_dir, tmp_path, processes
):
    """SIGTERM to one of two trainer pods, three times, mid-epoch: every worker exits 143 after the same
    step, the chief's checkpoint is at that step, and the restarted pods resume there; the last restart
    ends with the weights of an uninterrupted run (exactly: the same steps on the same batches)."""
    manifests = k8s.render(k8s.Options(workers=2, data_workers=0, gpus_per_worker=0))
    _, _, container = trainer_parts(manifests)
    steps = 100  # a stop lands a few steps after its trigger: far from the epoch ends and the run's end
    runs = tmp_path / "runs"
    overrides = data_sets(damaged_copy(tiny_data_dir, tmp_path)) + QUICK
    overrides += [f"runs_dir={runs}", "train.epochs=2", f"train.steps_per_epoch={steps}"]
    overrides += ["checkpoint.every_steps=5", "pipeline.skip_corrupt=true"]

    # The uninterrupted reference, with the local launcher and a profile window on every worker.
    fit_args = pod_command(container, {}, {})[3:]
    measured = ["profile.enabled=true", "profile.start_step=5", "profile.num_steps=3", "monitor.enabled=true"]
    launcher = processes.start(
        "reference",
        [sys.executable, "-m", "train", "launch", "--workers", "2", "--", *fit_args]
        + [arg for item in overrides + measured + ["name=reference"] for arg in ("--set", item)],
        base_env(),
    )
    wait_all([launcher], 300)
    assert launcher.returncode == 0 and "all 2 workers finished" in output(launcher), output(launcher)[-3000:]
    assert "[worker 1] " in output(launcher) and output(launcher).count(" done: ") == 1  # the chief's summary
    reference = json.loads((runs / "reference" / "summary.json").read_text())
    assert reference["workers"] == reference["replicas"] == 2 and reference["global_batch_size"] == 16
    fingerprints = {
        json.loads(p.read_text())["weights_sha256"] for p in (runs / "reference" / "workers").glob("*.json")
    }
    assert fingerprints == {reference["weights_sha256"]} and (runs / "reference" / "model.keras").exists()
    assert reference["skipped_records"] == 1
    assert reference["profile"] is not None and reference["input_bound_percent"] is not None
    assert list((runs / "reference").glob("plugins/profile/*/*.xplane.pb")), "the chief's profile"
    assert list((runs / "reference" / "workers" / "worker-1").glob("plugins/profile/*/*.xplane.pb"))
    assert reference["cpu_utilization_percent"] is not None  # the chief samples its host ...
    for folder in (runs / "reference", runs / "reference" / "workers" / "worker-1"):  # ... and so does each worker
        assert list((folder / "system").glob("events.out.tfevents.*")), folder
    kept = [folder.name for folder in checkpoint.list_checkpoints(runs / "reference")]
    assert kept == ["step-00000195", "step-00000200"]  # every_steps mid-epoch, then the run's end

    hosts = {address: f"localhost:{port}" for address, port in zip(pod_names(manifests), free_ports(2))}
    run_dir, stopped_at = runs / "optimized", 0
    for round_, (victim, trigger) in enumerate(((1, 10), (0, 115), (1, 150))):
        pods = start_trainers(processes, manifests, f"round{round_}", overrides, hosts)
        if stopped_at:
            for pod in pods:
                processes.wait_for(pod, f"resuming from {run_dir / 'checkpoints' / f'step-{stopped_at:08d}'} (")
        signal_when_a_checkpoint_reaches(pods, victim, run_dir, trigger)
        seconds = wait_all(pods, cluster.STOP_GRACE_S)
        assert [pod.returncode for pod in pods] == [143, 143], [output(pod)[-2000:] for pod in pods]
        lines = [next((line for line in output(pod).splitlines() if " stopped by " in line), "") for pod in pods]
        pattern = r"stopped by SIGTERM \((received here|received by another worker)\) after step (\d+)"
        found = [re.search(pattern, line) for line in lines]
        assert all(found), [output(pod)[-2000:] for pod in pods]
        step = int(found[0].group(2))
        assert int(found[1].group(2)) == step and trigger <= step < 2 * steps and step % steps, (lines, trigger)
        assert found[victim].group(1) == "received here" and found[1 - victim].group(1) != "received here"
        assert f"checkpoint saved at {run_dir / 'checkpoints' / f'step-{step:08d}'}" in lines[0]
        assert checkpoint.latest(run_dir)[1]["global_step"] == step and seconds < cluster.STOP_GRACE_S
        print(f"stop {round_ + 1}: SIGTERM to worker {victim}; both stopped after step {step}, 143, {seconds:.1f} s")
        stopped_at = step

    pods = start_trainers(processes, manifests, "final", overrides, hosts)
    wait_all(pods, 300)
    assert [pod.returncode for pod in pods] == [0, 0], [output(pod)[-2000:] for pod in pods]
    epoch, step = divmod(stopped_at, steps)
    assert all(f"step-{stopped_at:08d} (epoch {epoch + 1}, step {step})" in output(pod) for pod in pods)
    summary = json.loads((run_dir / "summary.json").read_text())
    fingerprints = {json.loads(path.read_text())["weights_sha256"] for path in (run_dir / "workers").glob("*.json")}
    assert fingerprints == {summary["weights_sha256"]} == {reference["weights_sha256"]}
    assert summary["history"]["val_loss"] == reference["history"]["val_loss"]


def signal_when_a_checkpoint_reaches(pods: list, victim: int, run_dir: Path, step: int, timeout: float = 240) -> None:
    """SIGTERM to pods[victim] once a checkpoint at `step` or later exists. Both pods are frozen (SIGSTOP)
    while the signal is sent, so they go on for at most the step they were in."""
    deadline = time.monotonic() + timeout
    while not any(int(folder.name.split("-")[1]) >= step for folder in checkpoint.list_checkpoints(run_dir)):
        assert all(pod.poll() is None for pod in pods), [output(pod)[-2000:] for pod in pods]
        assert time.monotonic() < deadline, f"no checkpoint at step {step} within {timeout} s"
        time.sleep(0.01)
    for pod in pods:
        pod.send_signal(signal.SIGSTOP)
    pods[victim].send_signal(signal.SIGTERM)
    for pod in pods:
        pod.send_signal(signal.SIGCONT)
