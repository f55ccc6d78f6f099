"""The deployment files checked against what the server really reads: KServe manifests, the
Dockerfile, the Grafana dashboard (its queries against a real scrape)."""

from __future__ import annotations

import json
import re
import textwrap
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import yaml

from runtime.cli import build_parser
from runtime.settings import ENV_PREFIX, MODEL_ENV_PARAMETERS, MODEL_ENV_PREFIX, ModelSettings, Settings
from tests.servers import ROOT, start_server

KSERVE = ROOT / "deploy" / "kserve"
KSERVE_MODEL_DIR = "/mnt/models"  # where KServe's storage initializer puts the model
KSERVE_SETS = ("MLSERVER_MODEL_NAME", "MLSERVER_MODEL_URI")  # what KServe adds for MLServer runtimes


def _documents(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((KSERVE / name).read_text()) if d]


def runtime_manifest() -> dict[str, Any]:
    (runtime,) = _documents("servingruntime.yaml")
    return runtime


def container() -> dict[str, Any]:
    (kserve,) = runtime_manifest()["spec"]["containers"]
    return cast(dict[str, Any], kserve)


def env_of(entries: list[dict[str, str]]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in entries}


def read_by_server(variable: str) -> bool:
    """Whether the server reads this variable (a field of Settings, of ModelSettings, or a parameter)."""
    if variable.startswith(MODEL_ENV_PREFIX):
        field = variable[len(MODEL_ENV_PREFIX) :].lower()
        if field in ModelSettings.model_fields or field in MODEL_ENV_PARAMETERS:
            return True
    return variable.startswith(ENV_PREFIX) and variable[len(ENV_PREFIX) :].lower() in Settings.model_fields


def test_the_serving_runtime_is_what_kserve_expects() -> None:
    runtime = runtime_manifest()
    assert (
        runtime["apiVersion"] == "serving.kserve.io/v1alpha1" and runtime["kind"] == "ClusterServingRuntime"
    )
    assert set(runtime["spec"]["protocolVersions"]) == {"v2", "grpc-v2"}
    assert container()["name"] == "kserve-container"
    assert "command" not in container() and "args" not in container()  # the image's CMD runs


def test_every_variable_is_one_the_server_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    env = env_of(container()["env"])
    for isvc in _documents("inferenceservice.yaml"):
        env.update(env_of(isvc["spec"]["predictor"]["model"].get("env", [])))
    unread = [name for name in env if not read_by_server(name)]
    assert not unread, f"variables the server does not read: {unread}"
    # and they hold values the settings accept
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8080, 9000, 8082)
    assert settings.use_structured_logging is True


def test_ports_probes_and_scrape_annotations_match_the_settings() -> None:
    runtime = runtime_manifest()
    env = env_of(container()["env"])
    annotations = runtime["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == env["MLSERVER_METRICS_PORT"]
    assert annotations["prometheus.io/port"] == env["MLSERVER_METRICS_PORT"]
    assert annotations["prometheus.kserve.io/path"] == Settings.model_fields["metrics_endpoint"].default
    assert annotations["prometheus.io/scrape"] == "true"
    for probe, path in (("readinessProbe", "/v2/health/ready"), ("livenessProbe", "/v2/health/live")):
        assert container()[probe]["httpGet"] == {"path": path, "port": int(env["MLSERVER_HTTP_PORT"])}
    grpc_services = [
        isvc
        for isvc in _documents("inferenceservice.yaml")
        if isvc["spec"]["predictor"]["model"]["protocolVersion"] == "grpc-v2"
    ]
    assert grpc_services
    for isvc in grpc_services:
        (port,) = isvc["spec"]["predictor"]["model"]["ports"]
        assert port["name"] == "h2c" and str(port["containerPort"]) == env["MLSERVER_GRPC_PORT"]
    for isvc in _documents("inferenceservice.yaml"):
        model = isvc["spec"]["predictor"]["model"]
        assert model["runtime"] == runtime["metadata"]["name"]
        assert "modelClass" in isvc["metadata"]["labels"]  # what MLSERVER_MODEL_IMPLEMENTATION reads


MODEL_PY = textwrap.dedent(
    """
    from runtime import MLModel
    from runtime.codecs import NumpyCodec
    from runtime.types import InferenceResponse

    class Echo(MLModel):
        async def predict(self, payload):
            scale = self.settings.parameters.extra["scale"]
            content_type = self.settings.parameters.content_type
            x = NumpyCodec.decode_input(payload.inputs[0]) * scale
            return InferenceResponse(
                model_name=self.name,
                parameters={"content_type_seen": content_type},
                outputs=[NumpyCodec.encode_output("y", x)],
            )
    """
)


@pytest.mark.parametrize("settings_file", [False, True], ids=["no model-settings.json", "one without a name"])
def test_an_inference_service_for_mlserver_runs_unchanged(tmp_path: Path, settings_file: bool) -> None:
    """The runtime's and the InferenceService's variables, plus what KServe adds, on KServe's
    /mnt/models: with no model-settings.json, the one model is served as MLServer serves it; with
    one that leaves the name and version out, the variables fill them in (as MLServer: the model is
    the InferenceService's, not the folder's ``models``)."""
    models = tmp_path / "models"
    models.mkdir()
    (models / "model.py").write_text(MODEL_PY)
    if settings_file:
        (models / "model-settings.json").write_text(
            json.dumps({"implementation": "model.Echo", "parameters": {"content_type": "np"}})
        )
    (isvc, _) = _documents("inferenceservice.yaml")
    env = env_of(container()["env"]) | env_of(isvc["spec"]["predictor"]["model"]["env"])
    env["MLSERVER_MODEL_IMPLEMENTATION"] = isvc["metadata"]["labels"]["modelClass"]  # {{.Labels.modelClass}}
    env |= {"MLSERVER_MODEL_NAME": isvc["metadata"]["name"], "MLSERVER_MODEL_URI": str(models)}
    env = {k: v for k, v in env.items() if not k.endswith("_PORT")}  # free ports in tests (flags)
    assert set(KSERVE_SETS) <= set(env)
    server = start_server(models, env=env)
    try:
        base = server.http_url
        meta = httpx.get(f"{base}/v2/models/echo").json()
        assert meta["versions"] == ["1"]
        body = {"inputs": [{"name": "x", "shape": [2], "datatype": "FP32", "data": [1, 2]}]}
        answer = httpx.post(f"{base}/v2/models/echo/versions/1/infer", json=body).json()
        assert answer["outputs"][0]["data"] == [2, 4]
        assert answer["parameters"]["content_type_seen"] == "np"
        assert httpx.get(server.metrics_url).status_code == 200
    finally:
        assert server.stop() == 0
    assert all(json.loads(line) for line in server.read_log().splitlines() if line.strip())  # structured


def test_model_parameters_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name, value in {
        "NAME": "m",
        "IMPLEMENTATION": "tests.models.zoo.Echo",
        "URI": str(tmp_path),
        "VERSION": "3",
        "FORMAT": "torchscript",
        "CONTENT_TYPE": "str",
        "EXTRA": '{"a": [1, 2]}',
    }.items():
        monkeypatch.setenv(MODEL_ENV_PREFIX + name, value)
    settings = ModelSettings.from_environment()
    assert settings.name == "m" and settings.version == "3"
    # a model-settings.json's own values win; the variables fill what it leaves out
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "model-settings.json").write_text(
        json.dumps(
            {"implementation": "tests.models.zoo.Echo", "parameters": {"version": "7", "extra": {"b": 1}}}
        )
    )
    filled = ModelSettings.from_file(tmp_path / "own" / "model-settings.json")
    assert (filled.name, filled.version) == ("m", "7")
    assert filled.parameters is not None
    assert (filled.parameters.format, filled.parameters.extra) == ("torchscript", {"b": 1})
    assert settings.parameters is not None
    assert (settings.parameters.uri, settings.parameters.format) == (str(tmp_path), "torchscript")
    assert (settings.parameters.content_type, settings.parameters.extra) == ("str", {"a": [1, 2]})
    assert settings.folder == tmp_path  # the model's code may live in the URI's folder
    monkeypatch.setenv(MODEL_ENV_PREFIX + "EXTRA", "not json")
    with pytest.raises(ValueError, match="MLSERVER_MODEL_EXTRA"):
        ModelSettings.from_environment()


# ---------------------------------------------------------------------- Dockerfile


def _dockerfile() -> list[tuple[str, str]]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def test_the_dockerfile_exposes_the_default_ports_and_runs_the_cli() -> None:
    instructions = _dockerfile()
    (exposed,) = [args for op, args in instructions if op == "EXPOSE"]
    defaults = {Settings.model_fields[f].default for f in ("http_port", "grpc_port", "metrics_port")}
    assert {int(p) for p in exposed.split()} == defaults
    (entrypoint,) = [json.loads(args) for op, args in instructions if op == "ENTRYPOINT"]
    (cmd,) = [json.loads(args) for op, args in instructions if op == "CMD"]
    assert entrypoint == ["mlserver-like"]  # the console script of pyproject.toml
    assert 'mlserver-like = "runtime.cli:main"' in (ROOT / "pyproject.toml").read_text()
    args = build_parser().parse_args(cmd)
    assert args.command == "start" and args.folder == KSERVE_MODEL_DIR
    assert args.host == "0.0.0.0" and Settings.model_fields["host"].default == "127.0.0.1"
    users = [args for op, args in instructions if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    bases = [args for op, args in instructions if op == "FROM"]
    assert all("-slim" in base for base in bases)
    assert any(op == "ARG" and args.startswith("WITH_TORCH") for op, args in instructions)
    run = " ".join(args for op, args in instructions if op == "RUN")
    assert ".[torch,tracing]" in run and '".[tracing]"' in run  # torch only when asked for


# ---------------------------------------------------------------------- Grafana dashboard

PROMQL_WORDS = {
    "sum", "rate", "increase", "irate", "avg", "max", "min", "count", "by", "without", "histogram_quantile",
    "label_values", "le", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset",
}  # fmt: skip


def dashboard_families() -> set[str]:
    document = json.loads((ROOT / "deploy" / "grafana" / "dashboard.json").read_text())
    expressions = [t["expr"] for panel in document["panels"] for t in panel["targets"]]
    expressions += [v["query"] for v in document["templating"]["list"] if v["type"] == "query"]
    assert len(expressions) > 10
    names: set[str] = set()
    for expr in expressions:
        expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
        expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
        expr = re.sub(r"\b(by|without)\s*\([^)]*\)", "", expr)  # grouping labels
        expr = re.sub(r",\s*[a-z_]+\)\s*$", ")", expr)  # label_values(metric, label)
        expr = re.sub(r"\$\w+", "", expr)
        names |= {w for w in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr) if w not in PROMQL_WORDS}
    return names


@pytest.fixture(scope="module")
def exposition(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A real scrape of a server serving a direct, a sequence and a continuous model."""
    folder = tmp_path_factory.mktemp("repo")
    models: dict[str, dict[str, Any]] = {
        "echo": {"implementation": "tests.models.zoo.Echo"},
        "seq": {"implementation": "tests.models.seqzoo.Recorder", "sequence_batching": True},
        "steps": {
            "implementation": "tests.continuous_models.Ticker",
            "continuous_batching": True,
            "max_batch_size": 2,
        },
    }
    for name, settings in models.items():
        (folder / name).mkdir(parents=True)
        (folder / name / "model-settings.json").write_text(json.dumps({"name": name, **settings}))
    server = start_server(folder)
    try:
        body = {"inputs": [{"name": "x", "shape": [1], "datatype": "FP32", "data": [1]}]}
        assert httpx.post(f"{server.http_url}/v2/models/echo/infer", json=body).status_code == 200
        return httpx.get(server.metrics_url).text
    finally:
        server.stop()


def test_every_dashboard_query_names_a_family_the_server_exports(exposition: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    text = exposition
    # what the families are exposed as, whether or not they have samples yet
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    exported = {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in suffixes.get(family.type, ("",))
    }
    queried = dashboard_families()
    missing = queried - exported
    assert not missing, f"dashboard queries families the server does not export: {sorted(missing)}"


def test_the_docs_list_every_family(exposition: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    docs = (ROOT / "docs" / "metrics.md").read_text()
    families = {family.name for family in text_string_to_metric_families(exposition)}
    assert len(families) >= 29
    missing = [name for name in sorted(families) if f"`{name}`" not in docs]
    assert not missing, f"families docs/metrics.md does not list: {missing}"
