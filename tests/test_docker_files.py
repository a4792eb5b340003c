"""docker/ stays consistent with the CLI: every `autotune` command it runs exists and parses.

Docker is not available here, so the images are not built; what can be checked without it is.
"""

import json
import re
import shlex
from pathlib import Path

import pytest
import yaml

from autotune.cli import build_parser
from autotune.cli.tune import parse_shard
from autotune.service.jobfile import load_job

DOCKER = Path(__file__).resolve().parent.parent / "docker"
SAMPLE_ENV = {"JOB_COMPLETION_INDEX": "3", "TUNING_DB": "postgresql://h/t", "STUDIES_DB": "x"}


def dockerfile_commands():
    for path in sorted(DOCKER.glob("Dockerfile.*")):
        text = path.read_text()
        entry = json.loads(re.search(r"^ENTRYPOINT (.*)$", text, re.M).group(1))
        cmd = json.loads(re.search(r"^CMD (.*)$", text, re.M).group(1))
        yield path.name, entry + cmd


def compose_commands():
    doc = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    for name, service in doc["services"].items():
        if "command" in service:  # the workers' images have `autotune` as their entry point
            yield f"compose:{name}", ["autotune", *service["command"]]


def k8s_manifests():
    for path in sorted((DOCKER / "k8s").glob("*.yaml")):
        yield from yaml.safe_load_all(path.read_text())


def k8s_commands():
    for doc in k8s_manifests():
        for c in doc["spec"]["template"]["spec"]["containers"]:
            script = " ".join(c["command"][2:] + c["args"])
            for var, value in SAMPLE_ENV.items():
                script = script.replace(f"${var}", value)
            yield f"k8s:{doc['metadata']['name']}:{c['name']}", shlex.split(script)


COMMANDS = [*dockerfile_commands(), *compose_commands(), *k8s_commands()]


@pytest.mark.parametrize("where, argv", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_every_command_in_docker_files_parses(where, argv):
    assert argv[0] == "autotune", where
    args = build_parser().parse_args(argv[1:])
    if getattr(args, "shard", None):
        assert parse_shard(args.shard) == (3, 4)
    if getattr(args, "job", None):
        assert args.job == "/jobs/job.toml"  # where every image and the Job put the job file


def test_there_are_commands_for_every_image_and_the_fleet():
    where = {w.split(":")[0] for w, _ in COMMANDS}
    assert where == {"Dockerfile.cpu", "Dockerfile.gpu", "Dockerfile.tpu", "compose", "k8s"}


def test_the_example_job_file_loads_and_the_images_ship_it():
    tasks = load_job(DOCKER / "job.example.toml")
    assert {t.kernel for t in tasks} == {"matmul", "vector_add"} and len(tasks) == 5
    for path in DOCKER.glob("Dockerfile.*"):
        assert "COPY docker/job.example.toml /jobs/job.toml" in path.read_text()
    compose = yaml.safe_load((DOCKER / "compose.yaml").read_text())
    urls = [a for a in compose["services"]["worker"]["command"] if a.startswith("postgresql")]
    assert len(set(urls)) == 2  # the studies need a database of their own
    assert "CREATE DATABASE studies" in (DOCKER / "initdb" / "studies.sql").read_text()


def test_a_deployment_of_watchers_per_accelerator_kind_beside_the_indexed_job():
    kinds = {doc["kind"] for doc in k8s_manifests()}
    assert kinds == {"Job", "Deployment"}
    watchers = [doc for doc in k8s_manifests() if doc["kind"] == "Deployment"]
    images = set()
    for doc in watchers:
        (c,) = doc["spec"]["template"]["spec"]["containers"]
        args = build_parser().parse_args(shlex.split(" ".join(c["args"]))[1:])
        assert args.pending and args.watch and args.devices == "all"
        assert (
            doc["spec"]["selector"]["matchLabels"] == doc["spec"]["template"]["metadata"]["labels"]
        )
        images.add(c["image"])
    assert images == {"pallas-autotune:gpu", "pallas-autotune:tpu"}
