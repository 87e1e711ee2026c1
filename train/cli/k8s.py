"""`python -m train k8s`: the Kubernetes manifests of deploy/k8s/, rendered for one image and cluster size.

    python -m train k8s --image registry.example.com/gpu-template:v1 --workers 4

The files in deploy/k8s/ are plain manifests with default values (image
gpu-utilization-template:latest, 2 workers, 1 GPU each, 2 tf.data service workers); rendering
loads them as YAML, sets the values that must agree with each other (a Job's completions, its
parallelism and TRAINER_WORKERS; the dispatcher's address in the trainer's command and the
data service's presence) and writes them to --out for `kubectl apply -f`. No template
language, no network: PyYAML and the files. `make lint` validates the result against the
Kubernetes API schemas (train/cli/lint.py).
"""

from __future__ import annotations

import copy
import dataclasses
import shlex
from pathlib import Path

import yaml

from train.core import files
from train.core.errors import UserError
from train.training import cluster

TEMPLATES = "deploy/k8s"
ORDER = ("storage.yaml", "dataset.yaml", "data-service.yaml", "trainer.yaml", "tensorboard.yaml")
TRAINER = "gpu-template-trainer"
DATA_WORKER = "gpu-template-data-worker"
DATA_SERVICE_KEY = "pipeline.data_service="
GPU = "nvidia.com/gpu"


@dataclasses.dataclass
class Options:
    image: str = "gpu-utilization-template:latest"
    workers: int = 2
    gpus_per_worker: int = 1
    data_workers: int = 2  # 0: no tf.data service; the trainers read the shards themselves
    config: str = "configs/optimized.yaml"
    overrides: list = dataclasses.field(default_factory=list)  # --set KEY=VALUE for the dataset Job and trainer
    storage_class: str | None = None


def load_templates(folder: Path | None = None) -> dict[str, list[dict]]:
    """Every template file's documents, by file name."""
    folder = folder or files.project_file(TEMPLATES)
    return {name: [doc for doc in yaml.safe_load_all((folder / name).read_text()) if doc] for name in ORDER}


def render(options: Options, templates: dict[str, list[dict]] | None = None) -> dict[str, list[dict]]:
    """The manifests for `options`, by file name (data-service.yaml left out without data workers)."""
    check(options)
    rendered = copy.deepcopy(templates or load_templates())
    if not options.data_workers:
        del rendered["data-service.yaml"]
    for docs in rendered.values():
        for doc in docs:
            for container in containers(doc):
                container["image"] = options.image
            if doc["kind"] == "PersistentVolumeClaim" and options.storage_class:
                doc["spec"]["storageClassName"] = options.storage_class
    job = find(rendered, "Job", TRAINER)
    job["spec"]["completions"] = job["spec"]["parallelism"] = options.workers
    trainer = containers(job)[0]
    set_env(trainer, cluster.WORKERS, str(options.workers))
    for resources in (trainer["resources"]["requests"], trainer["resources"]["limits"]):
        resources.pop(GPU, None)
        if options.gpus_per_worker:
            resources[GPU] = options.gpus_per_worker
    if not options.gpus_per_worker:
        job["spec"]["template"]["spec"].pop("tolerations", None)
    trainer["args"] = _with_config(trainer["args"], options)
    if not options.data_workers:
        trainer["args"] = _without_set(trainer["args"], DATA_SERVICE_KEY)
    else:
        find(rendered, "Deployment", DATA_WORKER)["spec"]["replicas"] = options.data_workers
    dataset = containers(find(rendered, "Job", "gpu-template-dataset"))[0]
    dataset["args"] = _with_config(dataset["args"], options)
    return rendered


def check(options: Options) -> None:
    problems = []
    if options.workers < 1:
        problems.append(f"--workers must be at least 1 (got {options.workers})")
    if options.gpus_per_worker < 0 or options.data_workers < 0:
        problems.append("--gpus-per-worker and --data-workers must be 0 or more")
    if not options.image or any(c.isspace() for c in options.image):
        problems.append(
            f"--image must be an image reference such as registry.example.com/gpu-template:v1 (got {options.image!r})"
        )
    for item in options.overrides:
        if "=" not in item:
            problems.append(f"--set {item!r} is not KEY=VALUE")
    if problems:
        raise UserError("Cannot render the Kubernetes manifests: " + "; ".join(problems) + ".")


def write(rendered: dict[str, list[dict]], out: Path, command: str) -> list[Path]:
    """Each file to `out` (atomically), with a header naming the command that rendered it."""
    written = []
    for name, docs in rendered.items():
        header = (
            f"# Rendered from {TEMPLATES}/{name} by\n#   {command}\n# Edit the template or rerun the command, "
            'not this file. Apply with `kubectl apply -f` (docs/scaling-out.md, "Kubernetes").\n'
        )
        text = header + yaml.safe_dump_all(docs, sort_keys=False, width=120)
        files.write_text(out / name, text)
        written.append(out / name)
    for stale in set(ORDER) - set(rendered):
        (out / stale).unlink(missing_ok=True)
    return written


def containers(doc: dict) -> list[dict]:
    """The containers of a Job's or Deployment's pod template (none for other kinds)."""
    if doc.get("kind") not in ("Job", "Deployment"):
        return []
    return doc["spec"]["template"]["spec"]["containers"]


def find(rendered: dict[str, list[dict]], kind: str, name: str) -> dict:
    for docs in rendered.values():
        for doc in docs:
            if doc["kind"] == kind and doc["metadata"]["name"] == name:
                return doc
    raise KeyError(f"{kind}/{name} is not in {TEMPLATES}")


def set_env(container: dict, name: str, value: str) -> None:
    for item in container.setdefault("env", []):
        if item["name"] == name:
            item.pop("valueFrom", None)
            item["value"] = value
            return
    container["env"].append({"name": name, "value": value})


def _with_config(args: list[str], options: Options) -> list[str]:
    args = list(args)
    args[args.index("--config") + 1] = options.config
    return args + [part for item in options.overrides for part in ("--set", item)]


def _without_set(args: list[str], prefix: str) -> list[str]:
    out = []
    for arg in args:
        if arg.startswith(prefix) and out and out[-1] == "--set":
            out.pop()
            continue
        out.append(arg)
    return out


def main(args) -> int:
    options = Options(
        image=args.image,
        workers=args.workers,
        gpus_per_worker=args.gpus_per_worker,
        data_workers=args.data_workers,
        config=args.config,
        overrides=args.overrides,
        storage_class=args.storage_class,
    )
    if not files.project_file(options.config).exists():
        raise UserError(
            f"--config {options.config} does not exist. The pods run it from the image, so it must be a preset "
            "in this project (configs/...), built into the image with `make docker-build`."
        )
    out = Path(args.out)
    command = "python -m train k8s " + shlex.join(
        ["--image", options.image, "--workers", str(options.workers), "--gpus-per-worker", str(options.gpus_per_worker)]
        + ["--data-workers", str(options.data_workers), "--config", options.config]
        + [part for item in options.overrides for part in ("--set", item)]
        + (["--storage-class", options.storage_class] if options.storage_class else [])
        + ["--out", str(out)]
    )
    written = write(render(options), out, command)
    print(f"Rendered {len(written)} files into {out}/: " + ", ".join(path.name for path in written))
    print(f'Apply them in this order (docs/scaling-out.md, "Kubernetes"): kubectl apply -f {out}/{ORDER[0]} ...')
    return 0
