"""What `make tune` searches for text: the text pipeline's knobs (reads, parse threads, cache, prefetch, the
padding the length buckets may leave: more or fewer bucket shapes) and the train knobs every workload shares.
None changes what is learned but the token budget, searched only with `batch` and with the learning rate
moving with it (linear scaling rule)."""

from __future__ import annotations

from train.core.tuning import Knob, dedupe, train_knobs


def space(cfg, spec, found, *, replicas: int = 1, batch: bool = False) -> list[Knob]:
    p, t = cfg.text.pipeline, cfg.train
    cores = max(1, found.cpu_cores)
    shards = max(1, len(spec.tokens_train))
    knobs: list[Knob] = []
    if batch and p.batching in ("bucket", "pack"):
        base_budget, base_rate = p.token_budget, t.learning_rate
        knobs.append(
            Knob(
                "text.pipeline.token_budget",
                [value for value in (2 * base_budget, base_budget // 2) if value >= spec.max_length],
                "token slots per batch; the learning rate is scaled with it (linear scaling rule)",
                also=lambda value: {"train.learning_rate": base_rate * value / base_budget},
            )
        )
    knobs.append(Knob("text.pipeline.cache", [True, False], "the parsed token ids kept in memory between epochs"))
    if p.reader == "tfrecord":
        knobs.append(Knob("text.pipeline.parallel_calls", dedupe(["auto", cores, 2 * cores]), "parse threads"))
        knobs.append(
            Knob(
                "text.pipeline.parallel_reads",
                dedupe(["auto", min(cores, shards), min(2 * cores, shards)]),
                "token shards read at once",
            )
        )
    knobs.append(Knob("text.pipeline.prefetch", ["auto", 4], "batches prepared ahead of the model"))
    if p.batching == "bucket" and p.bucket_lengths == "auto":
        knobs.append(
            Knob(
                "text.pipeline.max_padding",
                [value for value in (p.max_padding / 2, min(2 * p.max_padding, 0.5)) if value != p.max_padding],
                "padding the length buckets may leave: less is more bucket shapes (and XLA compiles), more is fewer",
            )
        )
    return knobs + train_knobs(found)
