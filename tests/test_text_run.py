"""The text task through the same commands as images: `python -m train fit` with a text preset trains, writes
its summary with the text figures (real tokens/s, padding share, shapes) and a model that serves raw strings;
`compare` with the text presets writes its report with the text columns; bench, sweep-batch and tune refuse a
text preset with a clear error."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli, set_args

# A small run of a text preset: the narrowest small Transformer, no profile or sampler unless a test wants them.
TEXT_SHORT = [
    "train.epochs=2",
    "model.name=text_small",
    "model.dim=8",
    "model.feed_forward=16",
    "text.pipeline.token_budget=4096",
    "monitor.enabled=false",
    "checkpoint.enabled=false",
]


def tiny_text(data_dir: Path) -> list[str]:
    return [
        f"text.data.data_dir={data_dir}",
        "text.data.num_train=192",
        "text.data.num_val=48",
        "text.data.num_shards=2",
        "text.data.max_tokens=3000",
    ]


def write_corpus_csv(path: Path, count: int) -> Path:
    """`count` rows of the built-in corpus (a learnable label) as a CSV with its own column names."""
    from train.workloads.text.corpus import Corpus, CorpusShape

    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["body", "topic"])
        for text, label in Corpus(CorpusShape(), seed=3).examples("train", count):
            writer.writerow([text, f"topic_{label}"])
    return path


def test_a_text_preset_is_a_config_like_any_other(tmp_path):
    from train import config
    from train.core.errors import UserError

    cfg = config.load(ROOT / "configs/text/optimized.yaml", layers=[ROOT / "configs/text/cpu.yaml"])
    assert (cfg.workload, cfg.name, cfg.model.name) == ("text", "text_optimized", "text_small")
    assert (cfg.text.pipeline.reader, cfg.text.pipeline.batching) == ("tfrecord", "bucket")
    config.save(cfg, tmp_path / "config.yaml")
    assert config.load(tmp_path / "config.yaml") == cfg  # saved into each run, read back unchanged
    assert config.load(ROOT / "configs/optimized.yaml").workload == "image"
    with pytest.raises(UserError, match=r"unknown key 'text\.pipeline\.bucket_size'.*Valid keys under"):
        config.load(ROOT / "configs/text/naive.yaml", ["text.pipeline.bucket_size=3"])
    with pytest.raises(UserError, match=r"'workload' must be 'image' or 'text', got 'audio'"):
        config.load(ROOT / "configs/text/naive.yaml", ["workload=audio"])
    with pytest.raises(UserError, match=r"'task' \(the earlier name of 'workload'\) is 'audio' but 'workload' is"):
        config.load(ROOT / "configs/text/naive.yaml", ["task=audio"])
    assert config.load(ROOT / "configs/text/naive.yaml", ["task=text"]).workload == "text"
    with pytest.raises(UserError, match=r"unknown key 'pipeline'\..*Valid keys: .*text"):
        config.load(ROOT / "configs/text/naive.yaml", ["pipeline.batch_size=8"])  # an image section
    with pytest.raises(UserError, match=r"'text\.pipeline\.token_budget' is 100 but must be >= data\.max_length"):
        config.load(ROOT / "configs/text/naive.yaml", ["text.pipeline.token_budget=100"])


def test_tune_searches_the_text_knobs_and_the_text_bench_has_no_data_service_variants(tmp_path):
    from train import config
    from train.benchmarks.tune import space
    from train.cli import benchmarks, build_parser
    from train.core.errors import UserError
    from train.training import devices
    from train.workloads.text.spec import TextSpec

    parse = lambda *argv: benchmarks.benchmark_options(build_parser().parse_args(list(argv)))  # noqa: E731
    tune = parse("tune", "--config", "configs/text/optimized.yaml")
    assert str(tune.tuned) == "configs/text/tuned.yaml" and str(parse("tune").tuned) == "configs/tuned.yaml"
    text = ("--naive", "configs/text/naive.yaml", "--optimized", "configs/text/optimized.yaml")
    assert parse("bench", *text).data_service_workers == ()
    assert parse("bench").data_service_workers == (1, 2)  # the image presets
    with pytest.raises(UserError, match=r"--data-service-workers 1`.*on the service only.*text/naive.yaml"):
        parse("bench", *text, "--data-service-workers", "1")

    spec = TextSpec("t", tmp_path, "builtin", ("a", "b"), 100, 512, 10, 2, (), (), ("0", "1"), (), (0,) * 513)
    found = devices.Devices(gpus=(), compute_capabilities=(), cpu_cores=2)
    cfg = config.load(ROOT / "configs/text/optimized.yaml")
    keys = [knob.key for knob in space.plan(cfg, spec, found)]
    assert keys[:4] == [
        "text.pipeline.cache",
        "text.pipeline.parallel_calls",
        "text.pipeline.parallel_reads",
        "text.pipeline.prefetch",
    ]
    assert "text.pipeline.max_padding" in keys and "train.jit_compile" in keys
    assert not any(key.startswith("pipeline.") for key in keys) and "text.pipeline.token_budget" not in keys
    batch = space.plan(cfg, spec, found, batch=True)[0]
    assert batch.key == "text.pipeline.token_budget" and batch.values == [32768, 8192]
    assert batch.apply({}, 8192)["train.learning_rate"] == pytest.approx(cfg.train.learning_rate / 2)
    with pytest.raises(UserError, match=r"--only pipeline.cache: not a knob tune searches here"):
        space.plan(cfg, spec, found, only=["pipeline.cache"])


def test_sweep_batch_sizes_a_text_batch_by_its_slots(tmp_path):
    """A batch of B for text is B texts of the longest length: the token budget where batches are bucketed or
    packed, the batch size where they are padded; an image run's out-of-memory hint ignores a text sweep."""
    import json

    from train import config
    from train.benchmarks import sweep
    from train.core import outputs
    from train.training import guards
    from train.workloads.text.spec import TextSpec

    spec = TextSpec("t", tmp_path, "builtin", ("a", "b"), 100, 512, 10, 2, (), (), (), (), (0,) * 513)
    optimized = config.load(ROOT / "configs/text/optimized.yaml")
    assert sweep.knob(optimized, 64, spec) == "text.pipeline.token_budget=32768"
    assert sweep.knob(config.load(ROOT / "configs/text/naive.yaml"), 64, spec) == "text.pipeline.batch_size=64"
    assert sweep.knob(config.load(ROOT / "configs/optimized.yaml"), 64, spec) == "pipeline.batch_size=64"
    path = outputs.sweep_result(tmp_path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"knob": "text.pipeline.token_budget", "largest_batch_that_fit": 64}))
    assert guards.largest_batch_that_fit(path, "pipeline.batch_size") is None
    path.write_text(json.dumps({"task": "text", "largest_batch_that_fit": 64}))  # written before "knob" was
    assert guards.largest_batch_that_fit(path, "pipeline.batch_size") is None
    path.write_text(json.dumps({"largest_batch_that_fit": 64}))  # an image sweep (written before "task" was)
    assert guards.largest_batch_that_fit(path, "pipeline.batch_size") == 64


@pytest.mark.long
def test_bench_and_sweep_batch_measure_the_text_presets_in_real_tokens(tmp_path_factory):
    """`bench` and `sweep-batch` with the text presets on a tiny corpus, short trials (as `make bench TASK=text`)."""
    out = tmp_path_factory.mktemp("text-bench")
    sets = tiny_text(out / "shards") + ["model.dim=8", "model.feed_forward=16", "text.pipeline.token_budget=4096"]
    presets = ["--naive", "configs/text/naive.yaml", "--optimized", "configs/text/optimized.yaml"]
    short = ["--trials", "2", "--seconds", "0.2"]
    result = run_cli("bench", *presets, "--out", str(out / "bench"), *short, *set_args(sets), timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "bench" / "bench.json").read_text())
    assert report["workload"] == "text" and report["unit"] == "real tokens/s" and not report["data_service"]
    assert set(report["variants"]) == {"naive", "optimized", "ceiling"} and report["speedup"] > 0
    assert "one epoch of" in report["variants"]["ceiling"]["pipeline"] and report["decode_floor"] is None
    for cost in report["pipeline_cost"].values():
        assert cost["core_seconds_per_token"] > 0 and cost["real_tokens_per_sec_alone"] > cost["texts_per_sec_alone"]
    assert "median tokens/s" in (out / "bench" / "bench.md").read_text()
    result = run_cli(
        "sweep-batch",
        *presets,
        "--out",
        str(out / "sweep"),
        "--min",
        "4",
        "--max",
        "8",
        *short,
        *set_args(sets),
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    swept = json.loads((out / "sweep" / "sweep.json").read_text())
    assert swept["knob"] == "text.pipeline.token_budget" and swept["unit"] == "real tokens/s"
    assert [p["batch_size"] for p in swept["points"]] == [4, 8] and swept["largest_batch_that_fit"] == 8
    assert "real tokens/s" in result.stdout


@pytest.mark.slow
@pytest.mark.stack
def test_own_csv_trains_with_the_optimized_preset_and_serves_raw_strings(tmp_path):
    """A few hundred generated CSV rows, `python -m train fit` with the optimized text preset (in this process)."""
    import keras
    import numpy as np

    from train.cli import main

    path = write_corpus_csv(tmp_path / "topics.csv", 300)
    sets = TEXT_SHORT + [
        "train.epochs=1",
        f"text.data.source=csv:{path}",
        "text.data.text_key=body",
        "text.data.label_key=topic",
        f"text.data.data_dir={tmp_path / 'shards'}",
        "text.data.max_tokens=3000",
        "text.data.num_shards=2",
        f"runs_dir={tmp_path / 'runs'}",
        "profile.enabled=false",
    ]
    assert main(["data", "--config", "configs/text/optimized.yaml", *set_args(sets)]) == 0
    assert main(["fit", "--config", "configs/text/optimized.yaml", *set_args(sets)]) == 0
    run = tmp_path / "runs" / "text_optimized"
    summary = json.loads((run / "summary.json").read_text())
    text = summary["text"]
    assert summary["workload"] == "text" and summary["dataset"]["num_classes"] == 4
    assert text["real_tokens_per_s"] > 0 and text["padded_slots_per_s"] >= 0
    assert text["padding_share"] < 0.3  # length buckets; padding to 512 would waste about 69 %
    assert 1 <= text["distinct_shapes"] == len(text["shapes"]) <= 10
    assert text["jit_compile"] is False and text["xla_compiles"] is None  # no XLA on a CPU (plan.py)
    assert summary["examples_per_sec"] == pytest.approx(text["texts_per_s"])
    assert "bucket(" in summary["pipeline"] and summary["val_accuracy"] is not None
    saved = (run / "config.yaml").read_text()
    assert "workload: text" in saved and "batching: bucket" in saved and "bucket_lengths:\n" in saved  # resolved
    assert any(p.name.endswith(".text") for p in (run / "train").iterdir())  # the text/* TensorBoard scalars

    serving = keras.models.load_model(run / "serving.keras")
    logits = serving(np.array(["a short text", "another text, a little longer than the first one"]))
    assert tuple(logits.shape) == (2, 4)


@pytest.mark.long
def test_compare_text_reports_tokens_padding_and_shapes(tmp_path_factory):
    """`compare` with the text presets on a tiny corpus (two runs in fresh processes, as `make compare TASK=text`)."""
    out = tmp_path_factory.mktemp("text-compare")
    # one epoch, no profile: the profile's input wait and compare's diagnosis are the image compare's code
    sets = TEXT_SHORT + tiny_text(out / "shards") + ["train.epochs=1", "profile.enabled=false"]
    presets = ["--naive", "configs/text/naive.yaml", "--optimized", "configs/text/optimized.yaml"]
    result = run_cli("compare", *presets, "--out", str(out / "compare"), *set_args(sets), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "configs/text/cpu.yaml" in result.stdout  # the text CPU scenario: the small Transformer
    assert "real (non-padding) tokens/s" in result.stdout and "speedup" in result.stdout
    report = json.loads((out / "compare" / "report.json").read_text())
    assert report["workload"] == "text" and report["speedup_of"] == "real_tokens_per_s"
    naive, optimized = report["runs"]["naive"], report["runs"]["optimized"]
    assert naive["distinct_shapes"] == 1 and naive["padding_share_percent"] > 50  # everything padded to 512
    assert optimized["padding_share_percent"] < 30 and optimized["distinct_shapes"] > 1
    assert naive["xla_compiles"] == "XLA off" and naive["val_accuracy"] is not None
    markdown = (out / "compare" / "report.md").read_text()
    for column in ("| real (non-padding) tokens/s |", "| padding share |", "| distinct input shapes |"):
        assert column in markdown
    assert (out / "compare" / "report.png").stat().st_size > 10_000


def test_the_text_ladder_is_the_default_for_a_text_preset():
    from train import scenario
    from train.benchmarks import ladder

    rungs = ladder.load_ladder(ROOT / "configs/ladder/text.yaml")
    assert [rung["name"] for rung in rungs["rungs"]][:5] == [
        "tokenize once",
        "parallel reads + parse",
        "cache + shuffle",
        "length buckets",
        "prefetch",
    ]
    cpu = scenario.Scenario([str(ROOT / "configs/text/cpu.yaml")], "")
    assert ladder.default_ladder(cpu, "text") == ROOT / "configs/ladder/text.yaml"
    assert ladder.default_ladder(cpu, "image") == ROOT / "configs/ladder/ladder.yaml"


SHORT_TEXT_LADDER = {
    "start": str(ROOT / "configs/text/naive.yaml"),
    "rungs": [
        {"name": "tokenize once", "set": {"text.pipeline.reader": "tfrecord"}},
        {"name": "length buckets", "set": {"text.pipeline.batching": "bucket", "text.pipeline.cache": True}},
    ],
}


@pytest.mark.long
def test_the_text_ladder_measures_its_rungs_in_real_tokens(tmp_path_factory):
    """`ladder` with the text presets (as `make ladder TASK=text`), two of the shipped rungs, short trials."""
    import yaml

    out = tmp_path_factory.mktemp("text-ladder")
    rungs = out / "ladder.yaml"
    rungs.write_text(yaml.safe_dump(SHORT_TEXT_LADDER))
    sets = tiny_text(out / "shards") + ["model.dim=8", "model.feed_forward=16", "text.pipeline.token_budget=4096"]
    presets = ["--naive", "configs/text/naive.yaml", "--optimized", "configs/text/optimized.yaml"]
    result = run_cli(
        "ladder",
        *presets,
        *("--ladder", str(rungs), "--out", str(out / "ladder"), "--trials", "2", "--seconds", "0.1"),
        *set_args(sets),
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "ladder" / "ladder.json").read_text())
    assert report["unit"] == "real tokens/s"
    assert [row["name"] for row in report["rungs"]] == ["tokenize once", "length buckets"]
    assert all(row["examples_per_sec"]["median"] > 0 for row in report["rungs"])
    assert "bucket(" in report["rungs"][1]["pipeline"] and report["end_to_end"]["median"] > 0
    assert "| # | rung | real tokens/s" in (out / "ladder" / "ladder.md").read_text()


@pytest.mark.long
def test_tune_searches_a_mis_set_text_start_and_writes_only_text_knobs(tmp_path_factory):
    """`tune` on the optimized text preset with its pipeline mis-set (serial, no cache, no prefetch), two knobs,
    short trials: a tune.json in real tokens/s, and an overlay (if anything was kept) that loads."""
    import yaml

    from train import config
    from train.benchmarks.tune import overlay

    out = tmp_path_factory.mktemp("text-tune")
    tuned = out / "tuned.yaml"
    mis_set = ["text.pipeline.parallel_calls=1", "text.pipeline.prefetch=0", "text.pipeline.cache=false"]
    sets = tiny_text(out / "shards") + ["model.dim=8", "model.feed_forward=16", "text.pipeline.token_budget=4096"]
    result = run_cli(
        "tune",
        *("--config", "configs/text/optimized.yaml", "--tuned", str(tuned), "--out", str(out / "tune")),
        *("--seconds", "0.3", "--trials", "3", "--final-trials", "3", "--minutes", "2"),
        *("--only", "text.pipeline.parallel_calls", "--only", "text.pipeline.prefetch"),
        *set_args(sets + mis_set),
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads((out / "tune" / "tune.json").read_text())
    assert report["workload"] == "text" and "training texts" in report["dataset"]
    assert {row["knob"] for row in report["trials"]} <= {"text.pipeline.parallel_calls", "text.pipeline.prefetch"}
    assert any("gain" in row for row in report["trials"]), report["trials"]
    assert "best tokens/s" in (out / "tune" / "tune.md").read_text()
    if tuned.exists():
        kept = overlay.flatten(yaml.safe_load(tuned.read_text()))
        assert set(kept) <= {"text.pipeline.parallel_calls", "text.pipeline.prefetch"} and kept
        loaded = config.load(ROOT / "configs/text/optimized.yaml", sets, layers=[tuned])
        assert all(config_value(loaded, key) == value for key, value in kept.items())
        assert "make train-optimized TASK=text" in tuned.read_text()
    else:
        assert report["note"], report


def config_value(cfg, key: str):
    from train.benchmarks.tune import space

    return space.get(cfg, key)
