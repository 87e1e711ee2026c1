"""The container files, checked by the tools that run without a Docker engine."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from train.cli import lint

ROOT = Path(__file__).resolve().parents[1]


def make_targets() -> set[str]:
    return set(re.findall(r"^([a-zA-Z0-9_-]+):", (ROOT / "Makefile").read_text(), re.M))


def cli_commands() -> set[str]:
    from train import cli

    return cli.command_names()


def doctor_commands() -> set[str]:
    from step_doctor import cli

    return cli.subcommands(cli.build_parser())


def test_hadolint_finds_nothing():
    assert lint.hadolint(ROOT / "Dockerfile") == []


def test_hadolint_does_report_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install curl\n")
    codes = {finding["code"] for finding in lint.hadolint(bad)}
    assert {"DL3007", "DL3008"} <= codes


def test_compose_file_is_valid():
    result = lint.compose_config(ROOT / "docker-compose.yml")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("breakage", ["count_and_ids", "bad_key"])
def test_the_same_check_rejects_a_broken_compose_file(tmp_path, breakage):
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    service = compose["services"]["train-optimized"]
    if breakage == "count_and_ids":  # `count` and `device_ids` are exclusive
        service["deploy"] = {
            "resources": {
                "reservations": {
                    "devices": [{"driver": "nvidia", "count": 1, "device_ids": ["0"], "capabilities": ["gpu"]}]
                }
            }
        }
    else:
        service["shm_sise"] = "2gb"
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(yaml.safe_dump(compose))
    assert lint.compose_config(broken).returncode != 0


def test_services_use_gpus_shared_volumes_and_existing_commands():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    assert {"train-naive", "train-optimized", "compare", "tensorboard", "data-dispatcher", "data-worker"} <= set(
        services
    )
    targets, commands = make_targets(), cli_commands()
    for name, service in services.items():
        command = service["command"]
        if command[:2] == ["sh", "-c"]:
            command = command[2].removeprefix("exec ").split()
        if command[0] == "make":
            assert command[1] in targets, f"{name}: make target {command[1]} does not exist"
        elif command[0] == "step-doctor":
            assert command[1] in doctor_commands(), name
        else:
            assert command[:3] == ["python", "-m", "train"] and command[3] in commands, name
    gpu_services = [name for name, s in services.items() if s.get("deploy")]
    assert {"train-naive", "train-optimized", "compare"} <= set(gpu_services)
    assert not services["data-worker"].get("deploy") and "ports" not in services["data-worker"]
    for service in (services[name] for name in gpu_services):
        devices = service["deploy"]["resources"]["reservations"]["devices"]
        assert devices[0]["driver"] == "nvidia" and devices[0]["capabilities"] == ["gpu"]
        assert "./runs:/workspace/template/runs" in service["volumes"]
        assert "./shards:/workspace/template/shards" in service["volumes"]
        assert service["shm_size"]
    assert services["tensorboard"]["ports"] == ["127.0.0.1:6006:6006"]


DOCS = ROOT / "docs"
MAKE_TARGETS_PAGE = DOCS / "make-targets.md"  # the reference of every target: the README names only a few


def documentation() -> dict[Path, str]:
    """The README and every page of the docs site."""
    return {path: path.read_text() for path in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]}


def named_targets(text: str) -> set[str]:
    """The targets a page tells the reader to run: `make X` in inline code, and lines of its code blocks that run
    `make X` (alone or after &&, ; or a parenthesis)."""
    named = set(re.findall(r"`make ([a-z0-9][a-z0-9-]*)", text))
    for block in re.findall(r"^```[a-z]*\n(.*?)^```", text, re.M | re.S):
        named |= set(re.findall(r"(?:^|&&|;|\()\s*make ([a-z0-9][a-z0-9-]*)", block, re.M))
    return named


def test_docker_make_targets_exist_and_are_documented():
    targets = make_targets()
    reference = MAKE_TARGETS_PAGE.read_text()
    docker_page = (DOCS / "docker.md").read_text()
    for target in (
        "docker-build",
        "docker-train-naive",
        "docker-train-optimized",
        "docker-compare",
        "docker-tensorboard",
    ):
        assert target in targets
        assert f"make {target}" in reference and f"make {target}" in docker_page


def test_the_readme_and_the_makefile_name_the_same_targets():
    """Every target `make help` lists is documented on the make-targets page, and every `make X` that the README or
    a docs page names exists."""
    helped = set(re.findall(r"^([a-zA-Z0-9_-]+):.*## ", (ROOT / "Makefile").read_text(), re.M))
    documented = named_targets(MAKE_TARGETS_PAGE.read_text())
    assert helped <= documented, f"targets {MAKE_TARGETS_PAGE.name} does not document: {helped - documented}"
    for path, text in documentation().items():
        missing = named_targets(text) - make_targets()
        assert not missing, f"{path.relative_to(ROOT)} names missing targets: {missing}"


def test_the_readme_is_the_first_ten_minutes():
    """The README stays short enough to read first; the reference lives in docs/."""
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines <= 300, f"README.md has {lines} lines: move reference material into docs/"


def slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) and GitHub give a heading, for the headings these pages use."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading)
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_every_relative_link_in_the_readme_points_to_an_existing_file_and_heading():
    text = (ROOT / "README.md").read_text()
    links = re.findall(r"!?\[[^\]]*\]\(([^)\s]+)\)", text)
    relative = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert relative, "the README links into docs/"
    for link in relative:
        target, _, anchor = link.partition("#")
        path = ROOT / target if target else ROOT / "README.md"
        assert path.is_file(), f"README.md links to {link}: no such file"
        if anchor:
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            assert anchor in {slug(h) for h in headings}, f"README.md links to {link}: no such heading"


def test_the_files_a_forker_touches_stay_readable_in_a_sitting():
    """The README's "Make it yours" names the files a forker reads and edits; together they stay under 800 lines."""
    section = (ROOT / "README.md").read_text().split("## Make it yours")[1].split("\n## ")[0]
    files = sorted({name for name in re.findall(r"`([\w/.-]+\.(?:py|yaml))`", section) if (ROOT / name).is_file()})
    assert {"configs/base.yaml", "configs/optimized.yaml", "train/models.py", "train/sources.py"} <= set(files)
    lines = sum((ROOT / name).read_text().count("\n") for name in files)
    assert lines < 800, f"{', '.join(files)}: {lines} lines together"


def test_docker_targets_fail_at_once_without_an_engine():
    if subprocess.run(["docker", "info"], capture_output=True).returncode == 0 if shutil.which("docker") else False:
        pytest.skip("a Docker engine answers here")
    result = subprocess.run(
        ["make", "--no-print-directory", "docker-train-optimized"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode != 0
    assert "no Docker engine answers here" in result.stderr


def test_dockerfile_installs_the_same_spec_as_make_setup_and_keeps_the_base_tensorflow():
    dockerfile = (ROOT / "Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=nvcr\.io/nvidia/tensorflow:[\w.-]+-tf2-py3$", dockerfile, re.M)
    assert "COPY pyproject.toml" in dockerfile
    installs = re.findall(r"pip install ([^&\n]+)", dockerfile)
    # the project's own spec, TF pinned, the rest at the tested versions
    assert installs == [
        '-c /tmp/keep-base.txt -c /tmp/constraints.txt -e "./doctor[bench]" -e . ',
        # the binding with GPM over the image's old pynvml package, at the tested version, nothing else
        "--no-deps --force-reinstall -c /tmp/constraints.txt nvidia-ml-py ",
    ], installs
    assert "freeze" in dockerfile and "tensorflow" in dockerfile.split("keep-base.txt")[0]
    assert "ARG CONSTRAINTS=constraints-container.txt" in dockerfile
    assert 'pip install -c $(SETUP_CONSTRAINTS) -e "./doctor[bench,test,jax]" -e ".[$(TF_EXTRA),dev]"' in makefile
    assert "$(if $(filter gpu,$(TF_EXTRA)),constraints-gpu.txt,constraints.txt)" in makefile
    assert re.search(r"^USER \d+", dockerfile, re.M), "the image runs as a non-root user"
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".venv", ".venv-container"} <= set(ignored)


def keep_base_rule(text: str) -> str:
    return re.search(r"pip freeze \| (grep -iE '[^']+')", text).group(1)


def test_the_container_stack_check_installs_as_the_dockerfile_does():
    dockerfile = (ROOT / "Dockerfile").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert keep_base_rule(makefile) == keep_base_rule(dockerfile)
    assert "-c constraints-container.txt" in makefile.split("test-container-stack:")[1]
    pins = dict(
        line.split("==")
        for line in (ROOT / "constraints-container.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    # the versions the default base image ships (see the file's header)
    assert pins["tensorflow-cpu"] == "2.17.0" and pins["tensorboard"] == "2.17.1"
    assert int(pins["tensorflow-metadata"].split(".")[1]) < 18 and int(pins["setuptools"].split(".")[0]) < 82


def test_the_base_images_own_packages_win_over_the_constraints(tmp_path):
    """The Dockerfile's awk drops a constraint on any package the base image keeps (names
    compared as pip does: case, `-`, `_` and `.` alike), so the two can never conflict. Docker
    joins the continued lines before the shell runs them, as done here."""
    program = re.search(r"awk -F'==' '(.*?)' \\\n\s+/tmp/keep-base.txt", (ROOT / "Dockerfile").read_text(), re.S)
    keep = tmp_path / "keep-base.txt"
    keep.write_text("tensorflow==2.17.0+nv25.2\nTensorflow_Metadata==1.16.0\ntf_keras==2.17.0\n")
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("# a comment\nkeras==3.15.1\ntensorflow-metadata==1.17.1\ntensorflow-cpu==2.17.0\n")
    result = subprocess.run(
        ["awk", "-F==", program.group(1).replace("\\\n", ""), str(keep), str(constraints)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.split() == ["keras==3.15.1", "tensorflow-cpu==2.17.0"]


def test_the_compose_profiling_service_can_trace_the_gpu_and_hands_files_back():
    """Root with SYS_ADMIN for this one service (CUPTI on a default driver), --chown to the host user."""
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    service = services["profile"]
    assert service["user"] == "0:0" and service["cap_add"] == ["SYS_ADMIN"]
    assert service["command"][:4] == ["step-doctor", "profile", "--chown", "${HOST_UID:-1000}:${HOST_GID:-1000}"]
    assert service["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] == ["gpu"]
    assert (
        "${PROFILE_DIR:-.}:/workspace/project" in service["volumes"] and service["working_dir"] == "/workspace/project"
    )
    assert all("cap_add" not in s and s.get("user") != "0:0" for name, s in services.items() if name != "profile")
    recipe = (ROOT / "Makefile").read_text().split("\ndocker-profile:")[1].split("\n\n")[0]
    assert "docker compose run --rm profile step-doctor profile --chown $(HOST_UID):$(HOST_GID)" in recipe


def test_lint_names_a_commit_whose_subject_is_longer_than_72_characters(tmp_path, monkeypatch):
    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, capture_output=True, text=True, check=True).stdout

    git("init", "-q")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "the base")
    monkeypatch.setattr(lint, "SUBJECTS_SINCE", git("rev-parse", "--short", "HEAD").strip())
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "short\n\nthe why")
    assert lint.commit_subjects(tmp_path) == []
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "x" * 73)
    (problem,) = lint.commit_subjects(tmp_path)
    assert "subject of 73 characters (at most 72)" in problem
