"""The Kubernetes backend: generated resources, dry runs, and its error sentences.

Resources are validated against the DaskCluster/DaskAutoscaler CRDs shipped in
the installed dask-kubernetes (its Helm chart's fully expanded OpenAPI
schemas).  Failures are exercised end to end — our backend, the real
``KubeCluster`` and kr8s — against a small fake Kubernetes API server on
loopback that answers with recorded API payloads (``tests/backends/k8s_responses``).
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time
import urllib.parse

import dask.config
import pytest
import yaml

pytest.importorskip("dask_kubernetes")
jsonschema = pytest.importorskip("jsonschema")

import jupyter_cluster as jc  # noqa: E402
from jupyter_cluster.backends import kubernetes as k8s  # noqa: E402
from jupyter_cluster.errors import ClusterError  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
RESPONSES = os.path.join(HERE, "k8s_responses")


def recorded(name: str) -> dict:
    with open(os.path.join(RESPONSES, name)) as f:
        return json.load(f)


# -- schema ----------------------------------------------------------------------
def _crd_schema(kind: str) -> dict:
    import dask_kubernetes

    path = os.path.join(
        os.path.dirname(dask_kubernetes.__file__),
        "operator",
        "deployment",
        "helm",
        "dask-kubernetes-operator",
        "crds",
        f"{kind}.yaml",
    )
    with open(path) as f:
        crd = yaml.safe_load(f)
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return version["schema"]["openAPIV3Schema"]


def _strict(schema):
    """Forbid fields the schema does not declare.

    Kubernetes silently *prunes* unknown fields of a structural CRD schema, so
    a misplaced setting would vanish rather than fail; strictness turns that
    into a test failure.
    """
    if isinstance(schema, dict):
        schema = {k: _strict(v) for k, v in schema.items()}
        if (
            schema.get("type") == "object"
            and "properties" in schema
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [_strict(s) for s in schema]
    return schema


@pytest.fixture(scope="module")
def validators():
    out = {}
    for kind, name in (("DaskCluster", "daskcluster"), ("DaskAutoscaler", "daskautoscaler")):
        schema = _strict(_crd_schema(name))
        # metadata is ObjectMeta, which the CRD leaves to the API server
        schema["properties"]["metadata"] = {"type": "object"}
        schema["properties"]["apiVersion"] = {"const": "kubernetes.dask.org/v1"}
        schema["properties"]["kind"] = {"const": kind}
        out[kind] = jsonschema.Draft4Validator(schema)
    return out


def _errors(validators, doc):
    return [f"{list(e.absolute_path)}: {e.message}" for e in validators[doc["kind"]].iter_errors(doc)]


def _worker(doc):
    return doc["spec"]["worker"]["spec"]["containers"][0]


def _scheduler(doc):
    return doc["spec"]["scheduler"]["spec"]["containers"][0]


COMBINATIONS = [
    {},
    {"workers": 100, "image": "ghcr.io/dask/dask:2026.8.0-py3.11", "namespace": "team-a"},
    {"worker_cpu": "500m", "worker_memory": "512MiB"},
    {"worker_cpu": 4, "worker_memory": "16GB", "worker_gpu": 2, "env": ["OMP_NUM_THREADS=1", "WANDB_MODE=offline"]},
    {"workers": 0, "adapt_min": 1, "adapt_max": 20, "env": {"EXTRA_PIP_PACKAGES": "gymnasium torch"}},
    {"adapt_min": 0, "worker_gpu": 1},
]


@pytest.mark.parametrize("options", COMBINATIONS, ids=lambda o: ",".join(sorted(o)) or "defaults")
def test_generated_resources_match_the_crd_schemas(validators, options):
    docs = k8s.resources(name="demo", **options)
    assert [d["kind"] for d in docs] == ["DaskCluster"] + (["DaskAutoscaler"] if "adapt_min" in options else [])
    for doc in docs:
        assert _errors(validators, doc) == []
    # And the YAML a dry run prints is the same objects.
    assert list(yaml.safe_load_all(k8s.dry_run(name="demo", **options))) == docs


def test_the_strict_schema_catches_misplaced_fields(validators):
    """The validation is not vacuous: typos and wrong types are reported."""
    doc = k8s.cluster_spec(name="demo")
    wrong = copy.deepcopy(doc)
    wrong["spec"]["worker"]["replicas"] = "3"
    assert any("not of type 'integer'" in e for e in _errors(validators, wrong))
    misplaced = copy.deepcopy(doc)
    misplaced["spec"]["worker"]["spec"]["containers"][0]["resource"] = {"limits": {"cpu": "1"}}
    assert any("resource" in e and "not allowed" in e for e in _errors(validators, misplaced))
    gpu_as_int = copy.deepcopy(doc)
    _worker(gpu_as_int)["resources"]["limits"]["nvidia.com/gpu"] = 1
    assert any("not of type 'string'" in e for e in _errors(validators, gpu_as_int))
    # dask-kubernetes' own template leaves nulls that the API server must drop;
    # ours is clean.
    from dask_kubernetes.operator import make_cluster_spec

    assert _errors(validators, make_cluster_spec("demo"))
    assert _errors(validators, doc) == []


def test_options_land_where_kubernetes_reads_them():
    doc = k8s.cluster_spec(
        name="rl-sweep",
        workers=12,
        image="registry.example/ml/dask:1.2",
        namespace="team-a",
        worker_cpu=4,
        worker_memory="16GiB",
        worker_gpu=2,
        env=["OMP_NUM_THREADS=1", "TOKEN=a=b"],
    )
    assert doc["apiVersion"] == "kubernetes.dask.org/v1" and doc["kind"] == "DaskCluster"
    assert doc["metadata"]["name"] == "rl-sweep" and doc["metadata"]["namespace"] == "team-a"
    assert doc["spec"]["worker"]["replicas"] == 12
    worker, scheduler = _worker(doc), _scheduler(doc)
    assert worker["image"] == scheduler["image"] == "registry.example/ml/dask:1.2"
    expected_env = [{"name": "OMP_NUM_THREADS", "value": "1"}, {"name": "TOKEN", "value": "a=b"}]
    assert worker["env"] == expected_env and scheduler["env"] == expected_env
    assert worker["resources"] == {
        "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"},
        "requests": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "2"},
    }
    # The scheduler needs no GPU, and Dask on the worker agrees with Kubernetes.
    assert "resources" not in scheduler
    args = worker["args"]
    assert args[:2] == ["dask", "worker"] and scheduler["args"][:2] == ["dask", "scheduler"]
    assert args[args.index("--nthreads") + 1] == "4"
    assert args[args.index("--memory-limit") + 1] == str(16 * 2**30)
    assert args[args.index("--resources") + 1] == "GPU=2"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in doc["spec"]["worker"]["spec"][
        "tolerations"
    ]


def test_fractional_cpu_and_decimal_memory():
    worker = _worker(k8s.cluster_spec(name="demo", worker_cpu=0.5, worker_memory="2GB"))
    assert worker["resources"]["limits"]["cpu"] == "500m"
    assert worker["args"][worker["args"].index("--nthreads") + 1] == "1"
    assert worker["args"][worker["args"].index("--memory-limit") + 1] == "2000000000"
    assert "resources" not in worker["args"] and "--resources" not in worker["args"]


def test_defaults_come_from_dask_config():
    with dask.config.set(
        {
            "jupyter-cluster.kubernetes.image": "hub.example/dask:team",
            "jupyter-cluster.kubernetes.namespace": "hub-users",
            "jupyter-cluster.kubernetes.workers": 7,
            "jupyter-cluster.kubernetes.worker-memory": "8GiB",
            "jupyter-cluster.kubernetes.env": {"DASK_DISTRIBUTED__WORKER__DAEMON": "False"},
        }
    ):
        doc = k8s.cluster_spec(name="demo", env=["EXTRA=1"])
    assert doc["metadata"]["namespace"] == "hub-users"
    assert doc["spec"]["worker"]["replicas"] == 7
    assert _worker(doc)["image"] == "hub.example/dask:team"
    assert _worker(doc)["resources"]["limits"]["memory"] == "8Gi"
    assert [e["name"] for e in _worker(doc)["env"]] == ["DASK_DISTRIBUTED__WORKER__DAEMON", "EXTRA"]
    # Unset image: the dask image of this notebook's versions, not "latest".
    import distributed

    assert k8s.default_image().startswith(f"ghcr.io/dask/dask:{distributed.__version__}-py3.")


@pytest.mark.parametrize(
    "options, sentence",
    [
        ({"env": ["NOEQUALS"]}, "is not KEY=VALUE"),
        ({"env": ["1BAD=x"]}, "not a valid environment variable name"),
        ({"worker_memory": "lots"}, "is not a size"),
        ({"worker_cpu": "-1"}, "--worker-cpu must be more than 0"),
        ({"worker_gpu": -1}, "--worker-gpu must be 0 or more"),
        ({"adapt_min": 5, "adapt_max": 2}, "0 <= --adapt-min <= --adapt-max"),
        ({"name": "My_Cluster"}, "cannot name a Kubernetes cluster"),
    ],
)
def test_bad_options_give_one_sentence(options, sentence):
    options = {"name": "demo", **options}
    with pytest.raises(ClusterError, match=sentence) as info:
        k8s.dry_run(**options)
    assert "\n" not in str(info.value)


def test_dry_run_magic_prints_yaml_and_starts_nothing(ip, capsys, validators):
    before = [h.name for h in jc.cluster.session.handles()]
    ip.run_line_magic(
        "cluster",
        "start --backend kubernetes --name sweep --workers 3 --worker-gpu 1 --worker-memory 2GiB "
        "--env A=1 B=2 --adapt-min 1 --adapt-max 6 --dry-run",
    )
    out = capsys.readouterr().out
    docs = list(yaml.safe_load_all(out))
    assert [d["kind"] for d in docs] == ["DaskCluster", "DaskAutoscaler"]
    assert all(_errors(validators, d) == [] for d in docs)
    assert docs[0]["metadata"]["name"] == "sweep" and docs[0]["spec"]["worker"]["replicas"] == 3
    assert [e["name"] for e in _worker(docs[0])["env"]] == ["A", "B"]
    assert docs[1]["spec"] == {"cluster": "sweep", "minimum": 1, "maximum": 6}
    assert [h.name for h in jc.cluster.session.handles()] == before
    # The same from Python.
    text = jc.start(backend="kubernetes", name="sweep", workers=2, dry_run=True)
    assert yaml.safe_load(text)["spec"]["worker"]["replicas"] == 2


def test_backends_refuse_options_they_do_not_take(ip):
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="the kubernetes backend does not take --gpus"):
        ip.run_line_magic("cluster", "start --backend kubernetes --gpus --dry-run")
    with pytest.raises(UsageError, match="the local backend does not take --image"):
        ip.run_line_magic("cluster", "start --image foo:1 --workers 1")
    with pytest.raises(UsageError, match="the local backend has no --dry-run"):
        ip.run_line_magic("cluster", "start --dry-run")


# -- failures, on recorded API responses ---------------------------------------------
class FakeKubernetesAPI:
    """Just enough of the Kubernetes API for KubeCluster, replaying recorded payloads.

    ``scenario`` picks the behaviour: ``"no-crd"`` (the DaskCluster kind is
    unknown), ``"no-operator"`` (resources are stored but nobody acts on them),
    ``"forbidden"`` (RBAC refuses), or ``"pods"`` (the operator marks the
    cluster Running and the pods listed in ``pods`` are what exists).
    """

    def __init__(self):
        self.scenario = "no-crd"
        self.pods: list[dict] = []
        self.clusters: dict[str, dict] = {}
        self.autoscalers: dict[str, dict] = {}
        self.services: list[dict] = []
        self.requests: list[tuple[str, str]] = []
        self.port = None
        self._ready = threading.Event()
        self._loop = None
        self._thread = threading.Thread(target=self._run, daemon=True, name="fake-k8s-api")

    def start(self):
        self._thread.start()
        assert self._ready.wait(10), "fake API server did not start"
        return self

    def stop(self):
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def reset(self, scenario, pods=(), services=()):
        self.scenario, self.pods, self.services, self.requests = scenario, list(pods), list(services), []
        self.clusters.clear()
        self.autoscalers.clear()

    def _run(self):
        import asyncio

        from tornado import httpserver, netutil, web

        api = self

        class Handler(web.RequestHandler):
            def _reply(self, code, body):
                self.set_status(code)
                if isinstance(body, str):
                    self.set_header("Content-Type", "text/plain")
                    return self.finish(body)
                self.set_header("Content-Type", "application/json")
                return self.finish(json.dumps(body))

            def _any(self, *_):
                api.requests.append((self.request.method, self.request.path))
                code, body = api.respond(self.request.method, self.request.path, self.request.query, self.request.body)
                return self._reply(code, body)

            get = post = put = patch = delete = _any

        async def main():
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            server = httpserver.HTTPServer(web.Application([(r"/.*", Handler)]))
            sockets = netutil.bind_sockets(0, "127.0.0.1")
            server.add_sockets(sockets)
            self.port = sockets[0].getsockname()[1]
            self._ready.set()
            await self._stop.wait()
            server.stop()

        asyncio.run(main())

    @staticmethod
    def _not_found(kind, name):
        return 404, {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f'{kind} "{name}" not found',
            "reason": "NotFound",
            "details": {"name": name, "kind": kind},
            "code": 404,
        }

    def respond(self, method, path, query, body):
        if path.rstrip("/") == "/version":
            return 200, {"major": "1", "minor": "31", "gitVersion": "v1.31.4", "platform": "linux/amd64"}
        params = urllib.parse.parse_qs(query)
        parts = path.strip("/").split("/")
        # API discovery, which kr8s uses to resolve kinds given by name ("pods").
        if path.rstrip("/") == "/api":
            return 200, {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}
        if path.rstrip("/") == "/api/v1":
            return 200, {
                "kind": "APIResourceList",
                "groupVersion": "v1",
                "resources": [
                    {
                        "name": n,
                        "singularName": n[:-1],
                        "namespaced": True,
                        "kind": k,
                        "verbs": ["get", "list", "watch"],
                    }
                    for n, k in (("pods", "Pod"), ("services", "Service"))
                ],
            }
        if path.rstrip("/") == "/apis":
            return 200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": []}
        if path.startswith("/apis/kubernetes.dask.org/v1/namespaces/"):
            ns, plural = parts[4], parts[5]
            name = parts[6] if len(parts) > 6 else None
            if self.scenario == "no-crd":
                return 404, "404 page not found\n"
            if self.scenario == "forbidden":
                status = recorded("forbidden.json")
                return 403, status
            if plural == "daskautoscalers":
                if method == "POST":
                    obj = json.loads(body)
                    self.autoscalers[obj["metadata"]["name"]] = obj
                    return 201, obj
                if name in self.autoscalers and method == "PATCH":
                    self.autoscalers[name]["spec"].update(json.loads(body).get("spec", {}))
                    return 200, self.autoscalers[name]
                if name in self.autoscalers and method == "DELETE":
                    return 200, self.autoscalers.pop(name)
                return self._not_found("daskautoscalers.kubernetes.dask.org", name or "")
            if plural != "daskclusters":
                return (201, json.loads(body)) if method == "POST" else self._not_found(plural, name or "")
            if method == "POST":
                obj = json.loads(body)
                obj["metadata"].setdefault("namespace", ns)
                if self.scenario == "pods":
                    obj["status"] = {"phase": "Running"}
                self.clusters[obj["metadata"]["name"]] = obj
                return 201, obj
            if name is None:  # list, maybe with a fieldSelector on the name
                selector = params.get("fieldSelector", [""])[0]
                wanted = {s.split("=", 1)[1] for s in selector.split(",") if s.startswith("metadata.name=")}
                items = [c for n, c in self.clusters.items() if not wanted or n in wanted]
                return 200, {
                    "apiVersion": "kubernetes.dask.org/v1",
                    "kind": "DaskClusterList",
                    "metadata": {"resourceVersion": "1"},
                    "items": items,
                }
            if name not in self.clusters:
                return self._not_found("daskclusters.kubernetes.dask.org", name)
            if method == "DELETE":
                return 200, self.clusters.pop(name)
            return 200, self.clusters[name]
        if path.startswith("/api/v1/namespaces/") and len(parts) in (5, 6) and parts[4] in ("pods", "services"):
            plural = parts[4]
            objects = self.pods if plural == "pods" else self.services
            if len(parts) == 6:  # one object by name
                found = [o for o in objects if o["metadata"]["name"] == parts[5]]
                return (200, found[0]) if found else self._not_found(plural, parts[5])
            selector = params.get("labelSelector", [""])[0]
            fields = dict(f.split("=", 1) for f in params.get("fieldSelector", [""])[0].split(",") if "=" in f)
            labels = dict(s.split("=", 1) for s in selector.split(",") if "=" in s)
            items = [
                o
                for o in objects
                if all(o["metadata"]["labels"].get(k) == v for k, v in labels.items())
                and ("status.phase" not in fields or o["status"].get("phase") == fields["status.phase"])
                and ("metadata.name" not in fields or o["metadata"]["name"] == fields["metadata.name"])
            ]
            kind = "PodList" if plural == "pods" else "ServiceList"
            return 200, {"apiVersion": "v1", "kind": kind, "metadata": {"resourceVersion": "1"}, "items": items}
        return self._not_found(parts[-2] if len(parts) > 1 else "resource", parts[-1])


@pytest.fixture(scope="module")
def fake_api(tmp_path_factory):
    api = FakeKubernetesAPI().start()
    kubeconfig = tmp_path_factory.mktemp("kube") / "config"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": f"http://127.0.0.1:{api.port}"}}],
                "users": [{"name": "alice", "user": {"token": "not-a-secret"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "alice", "namespace": "team"}}],
                "current-context": "fake",
            }
        )
    )
    old = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(kubeconfig)
    with dask.config.set(
        {
            "jupyter-cluster.kubernetes.resource-timeout": "2s",
            "jupyter-cluster.kubernetes.pending-timeout": "1s",
            "jupyter-cluster.kubernetes.startup-timeout": "30s",
        }
    ):
        yield api
    if old is None:
        os.environ.pop("KUBECONFIG", None)
    else:
        os.environ["KUBECONFIG"] = old
    api.stop()


def _start_error(**options) -> str:
    t0 = time.monotonic()
    with pytest.raises(ClusterError) as info:
        jc.start(backend="kubernetes", name="kubernetes-1", workers=1, **options)
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    assert time.monotonic() - t0 < 30, "the failure took too long to be reported"
    assert not [h for h in jc.cluster.session.handles() if h.backend == "kubernetes"]
    return message


def test_operator_not_installed(fake_api):
    fake_api.reset("no-crd")
    message = _start_error()
    assert message.startswith("this Kubernetes cluster does not know the DaskCluster resource")
    assert "helm install" in message


def test_operator_not_running(fake_api):
    """The resource is accepted but nothing sets its status: the "not actioned" case."""
    fake_api.reset("no-operator")
    message = _start_error()
    assert "the Dask operator did not pick up the DaskCluster" in message
    assert "probably not running" in message
    # What we created is deleted again.
    assert ("DELETE", "/apis/kubernetes.dask.org/v1/namespaces/team/daskclusters/kubernetes-1") in fake_api.requests
    assert fake_api.clusters == {}


def test_namespace_forbidden(fake_api):
    # kr8s answers a 403 by closing its HTTP session and re-authenticating, up to 3 times; a call of
    # dask-kubernetes reading from the closed session then gets httpx's ReadError ("did not answer").
    # That race is kr8s's (3 starts in 10 here): tried up to 3 times for the RBAC sentence.
    for _ in range(3):
        fake_api.reset("forbidden")
        message = _start_error(namespace="team-b")
        if "(ReadError)" not in message:
            break
    assert message.startswith(
        "Kubernetes does not allow system:serviceaccount:jhub:jupyter-alice to get daskclusters in namespace 'team-b'"
    )
    assert "RBAC" in message and "--namespace" in message


def test_image_pull_failure_is_reported_and_cleaned_up(fake_api):
    fake_api.reset("pods", [recorded("pod_image_pull_backoff.json")])
    message = _start_error(image="ghcr.io/dask/dask:no-such-tag")
    assert message.startswith(
        "the scheduler pod kubernetes-1-scheduler cannot pull image 'ghcr.io/dask/dask:no-such-tag'"
    )
    assert "--image" in message
    assert fake_api.clusters == {}, "the failed cluster was not deleted"


def test_pods_pending_past_the_timeout(fake_api):
    fake_api.reset("pods", [recorded("pod_unschedulable.json")])
    message = _start_error(worker_memory="64GiB")
    assert message.startswith("the scheduler pod kubernetes-1-scheduler has been pending for")
    assert "2 Insufficient memory" in message
    assert fake_api.clusters == {}


@pytest.fixture
def live_scheduler(fake_api):
    """A real Dask scheduler and worker that the fake API's service points at.

    With it, KubeCluster gets all the way through: the recorded scheduler pod
    is ready, the LoadBalancer service leads to 127.0.0.1, and the Dask
    connection is real.  (A bare Scheduler, not a LocalCluster: a cluster
    manager attaching to another manager's scheduler adopts its name.)
    """
    import asyncio
    import queue

    from distributed import Scheduler, Worker

    ready: queue.Queue = queue.Queue()
    control = {}

    async def serve():
        control["loop"], control["stop"] = asyncio.get_running_loop(), asyncio.Event()
        async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as scheduler:
            async with Worker(scheduler.address, nthreads=1, host="127.0.0.1"):
                ready.put(scheduler.address)
                await control["stop"].wait()

    thread = threading.Thread(target=asyncio.run, args=(serve(),), daemon=True, name="live-scheduler")
    thread.start()
    address = ready.get(timeout=60)
    service = recorded("service_scheduler_loadbalancer.json")
    service["spec"]["ports"][0]["port"] = int(address.rsplit(":", 1)[1])
    yield address, service
    control["loop"].call_soon_threadsafe(control["stop"].set)
    thread.join(30)


def test_start_through_the_operator_then_adapt_and_stop(fake_api, live_scheduler, validators):
    address, service = live_scheduler
    fake_api.reset("pods", [recorded("pod_scheduler_running.json"), recorded("pod_running.json")], [service])
    handle = jc.start(
        backend="kubernetes",
        name="kubernetes-1",
        workers=2,
        worker_memory="2GiB",
        env=["OMP_NUM_THREADS=1"],
        adapt_min=1,
        adapt_max=3,
    )
    try:
        assert handle.backend == "kubernetes" and handle.address == address
        assert handle.client.submit(sum, [1, 2, 3]).result() == 6
        # What reached the API server is what --dry-run shows, and valid.
        created = fake_api.clusters["kubernetes-1"]
        expected = k8s.resources(
            name="kubernetes-1", workers=2, worker_memory="2GiB", env=["OMP_NUM_THREADS=1"], adapt_min=1, adapt_max=3
        )
        assert created["spec"] == expected[0]["spec"]
        assert _errors(validators, created) == []
        autoscaler = fake_api.autoscalers["kubernetes-1"]
        assert autoscaler["spec"] == {"cluster": "kubernetes-1", "minimum": 1, "maximum": 3}
        assert autoscaler["metadata"]["labels"]["dask.org/cluster-name"] == "kubernetes-1"
        assert _errors(validators, autoscaler) == []
        # %cluster adapt on the handle updates the same resource.
        handle.adapt(2, 5)
        assert fake_api.autoscalers["kubernetes-1"]["spec"]["maximum"] == 5
    finally:
        handle.close()
    assert fake_api.clusters == {}, "stopping did not delete the DaskCluster"


def test_worker_pods_that_cannot_be_scheduled(fake_api, live_scheduler):
    """The scheduler comes up, the GPU workers never fit anywhere."""
    _, service = live_scheduler
    fake_api.reset(
        "pods", [recorded("pod_scheduler_running.json"), recorded("pod_worker_unschedulable.json")], [service]
    )
    message = _start_error(worker_gpu=1)
    assert message.startswith("the worker pod kubernetes-1-default-worker-7d2e9f1a0b has been pending for")
    assert "4 Insufficient nvidia.com/gpu" in message and "--worker-gpu" in message
    assert fake_api.clusters == {}


def test_no_kubeconfig_and_not_in_a_cluster(tmp_path):
    """Real kr8s with no credentials anywhere (a subprocess: kr8s caches its client)."""
    env = dict(os.environ, HOME=str(tmp_path), KUBECONFIG=str(tmp_path / "missing"))
    env.pop("KUBERNETES_SERVICE_HOST", None)
    code = (
        "import jupyter_cluster as jc\n"
        "try:\n"
        "    jc.start(backend='kubernetes', workers=1)\n"
        "except jc.ClusterError as e:\n"
        "    print('ERR', e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.startswith("ERR no Kubernetes credentials were found"), out.stdout + out.stderr
    assert "not running in a Kubernetes pod" in out.stdout


# -- sentences from recorded responses, without a server -------------------------------
def test_diagnose_pods_on_recorded_pod_states():
    pull = recorded("pod_err_image_pull.json")
    msg = k8s.diagnose_pods([recorded("pod_running.json"), pull], pending_for=0, pending_timeout=60)
    assert msg.startswith(
        "the worker pod kubernetes-1-default-worker-5f9a0c3e1b cannot pull image 'registry.internal/ml/dask-gpu:1.4'"
    )
    assert "no basic auth credentials" in msg and "imagePullSecrets" in msg
    # Pending is normal for a while (nodes scale up, images download) ...
    unschedulable = recorded("pod_unschedulable.json")
    assert k8s.diagnose_pods([unschedulable], pending_for=5, pending_timeout=60) is None
    # ... and reported once it lasts.
    msg = k8s.diagnose_pods([unschedulable], pending_for=61, pending_timeout=60)
    assert "has been pending for 61 s because Kubernetes cannot place it (0/3 nodes are available" in msg
    assert k8s.diagnose_pods([recorded("pod_running.json")], pending_for=999, pending_timeout=1) is None


def test_explain_recognises_only_what_it_knows():
    import httpx
    from kr8s._exceptions import ServerError

    request = httpx.Request("POST", "https://k8s.example:6443/apis/kubernetes.dask.org/v1/namespaces/team/daskclusters")
    body = recorded("forbidden.json")
    forbidden = ServerError(body["message"], status=body, response=httpx.Response(403, json=body, request=request))
    assert (
        "does not allow system:serviceaccount:jhub:jupyter-alice to get daskclusters in namespace 'team-b'"
        in k8s.explain(forbidden)
    )
    conflict = {
        "kind": "Status",
        "status": "Failure",
        "reason": "AlreadyExists",
        "code": 409,
        "message": 'daskclusters.kubernetes.dask.org "demo" already exists',
    }
    err = ServerError(
        conflict["message"], status=conflict, response=httpx.Response(409, json=conflict, request=request)
    )
    assert k8s.explain(err, "team").startswith("a DaskCluster with this name already exists in namespace 'team'")
    refused = httpx.ConnectError("[Errno 111] Connection refused", request=request)
    assert k8s.explain(refused).startswith("the Kubernetes API server at https://k8s.example:6443 did not answer")
    assert k8s.explain(KeyError("something else")) is None


def test_version_mismatch_sentence():
    from jupyter_cluster.cluster.versions import VersionMismatchWarning, mismatches, warn_on_mismatch

    same = {"python": "3.11.7.final.0", "dask": "2026.8.0", "distributed": "2026.8.0", "cloudpickle": "3.1.3"}
    versions = {
        "client": {"packages": same},
        "scheduler": {"packages": dict(same, python="3.11.9.final.0")},  # patch releases agree
        "workers": {
            "tcp://a:1": {"packages": dict(same, distributed="2024.1.0")},
            "tcp://b:1": {"packages": same},
        },
    }
    assert mismatches(versions) == ["distributed 2026.8.0 here, 2024.1.0 on the workers"]

    class Reporting:
        def get_versions(self):
            return versions

    with pytest.warns(
        VersionMismatchWarning, match=r"cluster 'k' runs other package versions .*distributed 2026.8.0 here"
    ):
        warn_on_mismatch(Reporting(), "k")
