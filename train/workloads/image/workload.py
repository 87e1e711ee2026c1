"""The image workload behind the one interface (train/workloads/base.py): datasets from train/sources.py,
the pipeline of pipeline.py, the models of train/models.py, examples/s, the decode floor."""

from __future__ import annotations

import os

from train import sources
from train.workloads.base import Features, Presets, Workload, with_value


class ImageWorkload(Workload):
    name = "image"
    presets = Presets(folder="configs", cpu_scenario="configs/scenarios/cpu.yaml", cpu_model="a tiny model")
    features = Features(data_service=True, decode_floor=True, multi_worker=True)

    def prepare_data(self, cfg, log=print):
        return sources.prepare(cfg.data)

    def locate(self, cfg, build_hint: str = "make data"):
        return sources.locate(cfg.data, build_hint)

    def describe_data(self, spec, built: bool) -> str:
        size_mb = sum(os.path.getsize(f) for f in spec.train_files + spec.val_files) / 2**20
        verb = "Built" if built else "Already built (nothing to do)"
        return (
            f"{verb}: {spec.name} at {spec.root}: {spec.num_train} train + {spec.num_val} validation examples, "
            f"{len(spec.train_files)}+{len(spec.val_files)} shards, {size_mb:.1f} MB, "
            f"images {'x'.join(map(str, spec.image_shape))}, {spec.num_classes} classes."
        )

    def dataset_facts(self, spec) -> dict:
        return {**super().dataset_facts(spec), **self.shape_facts(spec)}

    def shape_facts(self, spec) -> dict:
        return {"image_shape": list(spec.image_shape)}

    def dataset_line(self, spec) -> str:
        shape = "x".join(map(str, spec.image_shape))
        return f"{spec.name} ({spec.num_train} training images of {shape}, {spec.root})"

    def check_data(self, cfg, spec, build_hint: str) -> tuple[dict, list]:
        from train.workloads.image import data_checks

        data_checks.verify(cfg, spec, build_hint)
        readable = data_checks.readable(cfg, spec)
        return readable.damaged, readable.skipped

    def skips_corrupt(self, cfg) -> bool:
        return cfg.pipeline.skip_corrupt

    def data_error(self, error: Exception, spec, build_hint: str) -> Exception:
        from train.workloads.image import data_checks

        return data_checks.data_error(error, spec, build_hint)

    def resolve(self, cfg, spec, found):
        from train.workloads.image.choices import pipeline_choices

        knobs, reasons = pipeline_choices(cfg.pipeline, spec, gpu=bool(found.gpus))
        cfg, _ = super().resolve(cfg.with_section("pipeline", knobs), spec, found)
        return cfg, reasons

    def data_service(self, cfg) -> str | None:
        return cfg.pipeline.data_service

    def with_data_service(self, cfg, target: str):
        return with_value(cfg, "pipeline.data_service", target)

    def build_dataset(self, cfg, spec, *, split, training, batch_size, seed, files=None, damaged=None):
        from train.workloads.image import pipeline

        if files is None:
            files = spec.train_files if split == "train" else spec.val_files
        return pipeline.build(
            files, spec, cfg.pipeline, training=training, batch_size=batch_size, seed=seed, damaged=damaged
        )

    def describe_pipeline(self, cfg, spec, batch_size: int) -> str:
        from train.workloads.image import pipeline

        return pipeline.describe(cfg.pipeline, spec, spec.num_train, batch_size)

    def caches(self, cfg) -> bool:
        return cfg.pipeline.cache != "none"

    def model_input(self, cfg, spec):
        from train.workloads.image import pipeline

        return pipeline.image_shape(spec, cfg.pipeline)

    def build_model(self, cfg, spec):
        """The registry's model; with pipeline.augment: device, behind the augmentation layer (saved with it)."""
        model = super().build_model(cfg, spec)
        if cfg.pipeline.augment != "device" or not cfg.pipeline.transforms:
            return model
        import keras

        from train.workloads.image import augment

        images = keras.Input(shape=self.model_input(cfg, spec), dtype="uint8", name="image")
        layer = augment.DeviceAugment(seed=cfg.train.seed, transforms=cfg.pipeline.transforms, name="device_augment")
        return keras.Model(images, model(layer(images)), name=model.name)

    def decode_floor(self, cfg, spec, seconds: float) -> dict:
        from train.workloads.image import floor

        measured = floor.measure(cfg, spec, seconds)
        return {**measured, "cores_needed": floor.cores_needed(measured["core_seconds_per_example"])}

    def cost_figures(self, cost: dict, floor_result: dict | None, ceiling_rate: float) -> dict:
        from train.workloads.image import floor

        per_example = cost["core_seconds_per_example"]
        return {
            "floor_multiple": per_example / floor_result["core_seconds_per_example"],
            "cores_per_1000": per_example * 1000,
            "cores_needed": floor.cores_needed(per_example),
            "cores_to_feed_device": per_example * ceiling_rate,
        }

    def cost_lines(self, result: dict) -> list[str]:
        from train.workloads.image import floor

        return floor.cost_lines(result)

    def snapshot(self, cfg, spec) -> dict | None:
        """Where `cache: disk` (chosen by `auto` or set) keeps the decoded snapshot, whether an earlier run left
        it, and the --set that measures what `auto` takes without a cache folder."""
        if cfg.pipeline.cache != "disk":
            return None
        from train.workloads.image import pipeline

        folder = pipeline.snapshot_dir(cfg.pipeline, spec, training=True)
        return {
            "folder": str(folder),
            "reused": folder.is_dir() and any(folder.iterdir()),
            "expected_mb": pipeline.decoded_size_mb(spec, cfg.pipeline, spec.num_train),
            "without": ["pipeline.cache_dir=null"],
        }

    def tune_space(self, cfg, spec, found, *, replicas: int = 1, batch: bool = False):
        from train.workloads.image import tuning

        return tuning.space(cfg, spec, found, replicas=replicas, batch=batch)

    def vet(self, candidate, best, spec, replicas: int, start) -> str | None:
        from train.workloads.image import tuning

        return tuning.vet(candidate, best, spec, replicas, start)

    def hparams(self, config: dict) -> dict:
        p = config["pipeline"]
        return {
            "reader": p["reader"],
            "parallel_calls": str(p["parallel_calls"]),
            "cache": p["cache"],
            "prefetch": str(p["prefetch"]),
            "augment": p["augment"],
            **super().hparams(config),
        }


WORKLOAD = ImageWorkload()
