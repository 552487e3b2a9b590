"""Dask on Kubernetes through the dask-kubernetes operator (imported lazily).

The backend does three things dask-kubernetes leaves to the user:

* builds the ``DaskCluster`` resource from a few options whose defaults come
  from ``jupyter-cluster.kubernetes.*`` in dask.config, so a JupyterHub admin
  sets image, namespace and sizes once for every user (:func:`cluster_spec`);
* prints that resource instead of creating it (``--dry-run``);
* watches the pods while the cluster starts and turns the usual failures
  (no credentials, operator missing, image cannot be pulled, pods that cannot
  be scheduled, namespace forbidden) into one sentence each (:func:`explain`,
  :func:`diagnose_pods`), instead of a hang or a stack of HTTP errors.
"""

from __future__ import annotations

import asyncio
import math
import re
import sys
import time
from collections.abc import Iterable, Mapping
from contextlib import suppress
from typing import Any, cast

from .. import config
from ..errors import ClusterError
from . import Backend, StartedCluster
from .cli import ADAPT_MAX, ADAPT_MIN, WORKERS, Option

INSTALL_HINT = "pip install 'jupyter-cluster[kubernetes]'"
OPERATOR_HINT = (
    "install it with: helm install --repo https://helm.dask.org --create-namespace "
    "-n dask-operator --generate-name dask-kubernetes-operator"
)
GPU_RESOURCE = "nvidia.com/gpu"
API_GROUP = "kubernetes.dask.org/v1"
MANAGED_BY = {"app.kubernetes.io/managed-by": "jupyter-cluster"}

_NAME_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?")
_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


# -- options -------------------------------------------------------------------
def default_image() -> str:
    """The Dask image matching this notebook's distributed and Python versions.

    Workers must unpickle what the notebook pickles, so the image tag follows
    the notebook environment rather than ``latest``.
    """
    import distributed

    version = distributed.__version__.split("+")[0]
    return f"ghcr.io/dask/dask:{version}-py{sys.version_info.major}.{sys.version_info.minor}"


def parse_env(env: Any) -> dict[str, str]:
    """Normalise ``--env`` values into ``{name: value}``.

    Accepts a mapping, a ``"KEY=VALUE"`` string, or an iterable of such strings.
    """
    if env is None:
        return {}
    if isinstance(env, Mapping):
        items = [(str(k), v) for k, v in env.items()]
    else:
        if isinstance(env, str):
            env = [env]
        items = []
        for entry in env:
            key, sep, value = str(entry).partition("=")
            if not sep:
                raise ClusterError(f"--env {entry!r} is not KEY=VALUE; write it like --env OMP_NUM_THREADS=1.")
            items.append((key, value))
    out: dict[str, str] = {}
    for key, value in items:
        if not _ENV_NAME_RE.fullmatch(key):
            raise ClusterError(
                f"{key!r} is not a valid environment variable name; use letters, digits and '_' (not starting with a digit)."
            )
        out[key] = "" if value is None else str(value)
    return out


def k8s_memory(value: Any) -> tuple[str, int]:
    """Kubernetes quantity and byte count for a Dask-style size ("4GiB", "500MB", 2**30)."""
    from dask.utils import parse_bytes

    try:
        n = int(parse_bytes(value)) if isinstance(value, str) else int(value)
    except (ValueError, TypeError):
        raise ClusterError(f"--worker-memory {value!r} is not a size; write it like 4GiB or 512MiB.") from None
    if n <= 0:
        raise ClusterError("--worker-memory must be more than 0 bytes.")
    for suffix, factor in (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10)):
        if n % factor == 0:
            return f"{n // factor}{suffix}", n
    return str(n), n


def k8s_cpu(value: Any) -> tuple[str, int]:
    """Kubernetes CPU quantity and the worker thread count it implies."""
    text = str(value).strip()
    try:
        cores = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    except ValueError:
        raise ClusterError(f"--worker-cpu {value!r} is not a CPU amount; write it like 2, 0.5 or 500m.") from None
    if not cores > 0 or math.isinf(cores):
        raise ClusterError("--worker-cpu must be more than 0.")
    quantity = str(int(cores)) if cores == int(cores) else f"{int(round(cores * 1000))}m"
    return quantity, max(1, int(cores))


def validate_name(name: str) -> str:
    """Kubernetes object names are lowercase DNS labels; say so before the API does."""
    if not _NAME_RE.fullmatch(name):
        raise ClusterError(
            f"{name!r} cannot name a Kubernetes cluster; use at most 40 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit."
        )
    return name


def _resolved(options: dict[str, Any]) -> dict[str, Any]:
    """Options with the dask.config defaults filled in, validated."""

    def pick(key: str, cfg: str):
        value = options.get(key)
        return config.get(f"kubernetes.{cfg}") if value is None else value

    workers = pick("workers", "workers")
    if workers is None or int(workers) < 0:
        raise ClusterError("--workers must be 0 or more.")
    gpu = pick("worker_gpu", "worker-gpu") or 0
    try:
        gpu = int(gpu)
    except (TypeError, ValueError):
        raise ClusterError(f"--worker-gpu {gpu!r} is not a whole number of GPUs.") from None
    if gpu < 0:
        raise ClusterError("--worker-gpu must be 0 or more.")
    env = dict(parse_env(config.get("kubernetes.env") or {}))
    env.update(parse_env(options.get("env")))
    adapt_min, adapt_max = options.get("adapt_min"), options.get("adapt_max")
    if adapt_min is not None or adapt_max is not None:
        adapt_min = int(adapt_min or 0)
        adapt_max = int(adapt_max) if adapt_max is not None else max(adapt_min, int(workers), 1)
        if adapt_min < 0 or adapt_max < adapt_min:
            raise ClusterError("adaptivity needs 0 <= --adapt-min <= --adapt-max.")
    return {
        "name": validate_name(options.get("name") or "jupyter-cluster"),
        "namespace": pick("namespace", "namespace"),
        "workers": int(workers),
        "image": pick("image", "image") or default_image(),
        "worker_cpu": pick("worker_cpu", "worker-cpu"),
        "worker_memory": pick("worker_memory", "worker-memory"),
        "worker_gpu": gpu,
        "env": env,
        "adapt_min": adapt_min,
        "adapt_max": adapt_max,
    }


# -- resources -----------------------------------------------------------------
def _prune(obj: Any) -> Any:
    """Drop ``None`` fields, as the API server does; the CRD schema does not allow nulls."""
    if isinstance(obj, dict):
        return {k: _prune(v) for k, v in obj.items() if v is not None}
    if isinstance(obj, list):
        return [_prune(v) for v in obj]
    return obj


def cluster_spec(
    name: str,
    workers: int | None = None,
    image: str | None = None,
    namespace: str | None = None,
    worker_cpu: Any = None,
    worker_memory: Any = None,
    worker_gpu: int | None = None,
    env: Any = None,
    **_: Any,
) -> dict[str, Any]:
    """The ``DaskCluster`` resource for these options (defaults from dask.config).

    Starts from ``dask_kubernetes.operator.make_cluster_spec`` so the layout is
    the one the operator expects, then sets the worker's requests/limits,
    threads, memory limit and Dask resources to agree with each other.

    Returns
    -------
    dict
        A ``kubernetes.dask.org/v1`` ``DaskCluster`` object.
    """
    opts = _resolved(
        dict(
            name=name,
            workers=workers,
            image=image,
            namespace=namespace,
            worker_cpu=worker_cpu,
            worker_memory=worker_memory,
            worker_gpu=worker_gpu,
            env=env,
        )
    )
    try:
        from dask_kubernetes.operator import make_cluster_spec
    except ImportError as exc:
        raise ClusterError(
            f"the kubernetes backend needs dask-kubernetes, which is not installed; install it with: {INSTALL_HINT}"
        ) from exc
    cpu, nthreads = k8s_cpu(opts["worker_cpu"])
    memory, memory_bytes = k8s_memory(opts["worker_memory"])
    spec = make_cluster_spec(
        name=opts["name"],
        image=opts["image"],
        n_workers=opts["workers"],
        env=opts["env"] or None,
        resources=None,
        # distributed no longer installs the dask-worker/dask-scheduler scripts
        # that make_cluster_spec defaults to; `dask worker` works old and new.
        worker_command="dask worker",
    )
    scheduler_args = spec["spec"]["scheduler"]["spec"]["containers"][0]["args"]
    if scheduler_args[:1] == ["dask-scheduler"]:
        scheduler_args[:1] = ["dask", "scheduler"]
    spec["metadata"]["labels"] = dict(MANAGED_BY)
    if opts["namespace"]:
        spec["metadata"]["namespace"] = opts["namespace"]

    worker = spec["spec"]["worker"]["spec"]
    container = worker["containers"][0]
    limits: dict[str, Any] = {"cpu": cpu, "memory": memory}
    requests: dict[str, Any] = {"cpu": cpu, "memory": memory}
    # Dask must know what Kubernetes granted: threads follow the CPU limit,
    # the memory limit lets Dask spill before the kernel OOM-kills the pod,
    # and the GPU resource lets `resources={"GPU": 1}` place items there.
    container["args"] += ["--nthreads", str(nthreads), "--memory-limit", str(memory_bytes)]
    if opts["worker_gpu"]:
        # Quantities are strings in the DaskCluster schema, counts included.
        limits[GPU_RESOURCE] = str(opts["worker_gpu"])
        requests[GPU_RESOURCE] = str(opts["worker_gpu"])
        container["args"] += ["--resources", f"GPU={opts['worker_gpu']}"]
        # GPU node pools are usually tainted so that only GPU pods land there.
        worker["tolerations"] = [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]
    container["resources"] = {"limits": limits, "requests": requests}
    return _prune(spec)


def autoscaler_spec(name: str, minimum: int, maximum: int, namespace: str | None = None) -> dict[str, Any]:
    """The ``DaskAutoscaler`` resource that lets the operator adapt ``name`` between bounds."""
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"dask.org/cluster-name": name, "dask.org/component": "autoscaler", **MANAGED_BY},
    }
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": API_GROUP,
        "kind": "DaskAutoscaler",
        "metadata": meta,
        "spec": {"cluster": name, "minimum": int(minimum), "maximum": int(maximum)},
    }


def resources(**options: Any) -> list[dict[str, Any]]:
    """Every resource ``start`` would create: the cluster, and its autoscaler with adaptivity."""
    opts = _resolved(options)
    docs = [cluster_spec(**opts)]
    if opts["adapt_min"] is not None:
        docs.append(autoscaler_spec(opts["name"], opts["adapt_min"], opts["adapt_max"], opts["namespace"]))
    return docs


def dry_run(**options: Any) -> str:
    """YAML of the resources ``start`` would create, without contacting Kubernetes."""
    import yaml

    return yaml.safe_dump_all(resources(**options), sort_keys=False)


# -- errors ----------------------------------------------------------------------
_FORBIDDEN_RE = re.compile(
    r'User "(?P<user>[^"]+)" cannot (?P<verb>\w+) resource "(?P<resource>[^"]+)"'
    r'(?: in API group "(?P<group>[^"]*)")?(?: in the namespace "(?P<namespace>[^"]+)")?'
)


def _status_of(exc: BaseException) -> tuple[int | None, Any, Any]:
    """HTTP status code, parsed body and request of a kr8s/httpx error (or Nones)."""
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None)
    body = getattr(exc, "status", None)
    if body is None and response is not None:
        with suppress(Exception):
            body = response.json()
    request = None
    if response is not None:
        with suppress(Exception):
            request = response.request
    return code, body, request


def explain(exc: BaseException, namespace: str | None = None) -> str | None:
    """One sentence for a failure of dask-kubernetes/kr8s, or None when not recognised.

    Parameters
    ----------
    exc : BaseException
        What ``KubeCluster`` (or kr8s beneath it) raised.
    namespace : str, optional
        The namespace we asked for, named in the sentence.
    """
    where = f"namespace {namespace!r}" if namespace else "the current namespace"
    text = str(exc)
    if isinstance(exc, ValueError) and "Unable to find valid credentials" in text:
        return (
            "no Kubernetes credentials were found: there is no kubeconfig (~/.kube/config or $KUBECONFIG) and "
            "this notebook is not running in a Kubernetes pod; configure kubectl access or use another backend."
        )
    if isinstance(exc, FileNotFoundError) and "kube" in text.lower():
        return f"the kubeconfig file {exc.filename or text} does not exist; point $KUBECONFIG at a valid file."
    if "not actioned" in text:
        return (
            f"the Dask operator did not pick up the DaskCluster in {where} (no status after the resource timeout), "
            f"so it is probably not running; check `kubectl get pods -A -l app.kubernetes.io/name=dask-kubernetes-operator` or {OPERATOR_HINT}."
        )
    code, body, request = _status_of(exc)
    message = body.get("message", "") if isinstance(body, dict) else str(body or "")
    if code == 403:
        m = _FORBIDDEN_RE.search(message)
        if m:
            ns = m.group("namespace") or namespace
            place = f"in namespace {ns!r}" if ns else "cluster-wide"
            return (
                f"Kubernetes does not allow {m.group('user')} to {m.group('verb')} {m.group('resource')} {place}; "
                "ask an administrator for the Role in docs/kubernetes.md (RBAC) or choose a namespace you may use with --namespace."
            )
        return f"Kubernetes refused the request in {where} (403 Forbidden: {message or text}); ask an administrator for the RBAC in docs/kubernetes.md."
    if code == 401:
        return "the Kubernetes API rejected our credentials (401 Unauthorized); refresh your kubeconfig login (e.g. rerun your cloud's get-credentials command)."
    if code == 404:
        url = str(getattr(request, "url", "")) if request is not None else ""
        if "kubernetes.dask.org" in url or "daskcluster" in message.lower() or "daskcluster" in text.lower():
            return (
                "this Kubernetes cluster does not know the DaskCluster resource, so the Dask operator is not installed; "
                f"{OPERATOR_HINT}."
            )
        if isinstance(body, dict) and body.get("details", {}).get("kind") == "namespaces":
            return f"namespace {body['details'].get('name', namespace)!r} does not exist; create it or choose another with --namespace."
    if code == 409:
        return f"a DaskCluster with this name already exists in {where}; choose another --name or delete it with kubectl delete daskcluster NAME."
    if code == 422 or (code == 400 and message):
        return f"Kubernetes rejected the DaskCluster resource: {message or text}; check the options (see --dry-run)."
    try:
        from httpx import TransportError
    except ImportError:  # pragma: no cover - kr8s depends on httpx
        TransportError = None  # type: ignore[assignment,misc]
    if TransportError is not None and isinstance(exc, TransportError):
        url = ""
        with suppress(RuntimeError):  # .request raises when the error carries none
            url = f"{exc.request.url.scheme}://{exc.request.url.netloc.decode()}"
        return f"the Kubernetes API server{(' at ' + url) if url else ''} did not answer ({text or type(exc).__name__}); check your network/VPN and kubeconfig context."
    return None


def _waiting_reasons(pod: dict[str, Any]):
    status = pod.get("status") or {}
    for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason"):
            yield cs, waiting


def _component(pod: dict[str, Any]) -> str:
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get("dask.org/component", "pod")


def diagnose_pods(pods: Iterable[dict[str, Any]], pending_for: float, pending_timeout: float) -> str | None:
    """One sentence for pods that will not start, or None while things may still work out.

    Parameters
    ----------
    pods : iterable of dict
        Pod objects as the Kubernetes API returns them.
    pending_for : float
        Seconds we have been waiting so far.
    pending_timeout : float
        How long a pod may stay unschedulable or pulling before we give up.
    """
    for pod in pods:
        name = (pod.get("metadata") or {}).get("name", "?")
        who = f"the {_component(pod)} pod {name}"
        for cs, waiting in _waiting_reasons(pod):
            reason = waiting["reason"]
            image = cs.get("image", "?")
            msg = (waiting.get("message") or "").strip()
            if reason in ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"):
                detail = f" ({msg})" if msg else ""
                return (
                    f"{who} cannot pull image {image!r}{detail}; check the name and tag (--image), "
                    "and that the cluster may read that registry (imagePullSecrets)."
                )
            if reason in ("CreateContainerConfigError", "CreateContainerError"):
                return f"{who} cannot create its container ({msg or reason}); check --env and the secrets it refers to."
            if reason == "CrashLoopBackOff" and pending_for >= pending_timeout:
                return (
                    f"{who} keeps crashing (CrashLoopBackOff); see `kubectl logs {name}` - usually the image "
                    "lacks dask/distributed or its versions differ from the notebook's."
                )
        status = pod.get("status") or {}
        if status.get("phase") == "Pending" and pending_for >= pending_timeout:
            for cond in status.get("conditions") or []:
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    why = (cond.get("message") or cond.get("reason") or "no reason given").strip().rstrip(".")
                    return (
                        f"{who} has been pending for {pending_for:.0f} s because Kubernetes cannot place it ({why}); "
                        "ask for less --worker-cpu/--worker-memory/--worker-gpu or add nodes."
                    )
            return f"{who} has been pending for {pending_for:.0f} s; run `kubectl describe pod {name}` to see why."
    return None


# -- the cluster -------------------------------------------------------------------
def _kube_cluster_class():
    try:
        from dask_kubernetes.operator import KubeCluster
    except ImportError as exc:
        raise ClusterError(
            f"the kubernetes backend needs dask-kubernetes, which is not installed; install it with: {INSTALL_HINT}"
        ) from exc
    return KubeCluster


_guarded_class = None


def _guarded_kube_cluster():
    """``KubeCluster`` whose start is watched and bounded (built once, on first use)."""
    global _guarded_class
    if _guarded_class is not None:
        return _guarded_class
    KubeCluster: Any = _kube_cluster_class()  # dask-kubernetes is an optional extra, without type information

    class GuardedKubeCluster(KubeCluster):
        """A ``KubeCluster`` that gives up with a clear sentence instead of waiting forever.

        dask-kubernetes waits without a limit for a scheduler pod that can never
        run (image pull failure, unschedulable pod); this watches the pods while
        it starts, and also waits for the first worker pod to run.
        """

        def __init__(self, *, startup_timeout: float, pending_timeout: float, expect_workers: bool, **kwargs):
            self._jc_startup_timeout = startup_timeout
            self._jc_pending_timeout = pending_timeout
            self._jc_expect_workers = expect_workers
            try:
                super().__init__(**kwargs)
            except BaseException:
                # A half-started cluster must not be "reaped" noisily at exit.
                KubeCluster._instances.discard(self)
                with suppress(Exception):
                    self._loop_runner.stop()
                raise

        async def _list_pods(self) -> list[dict[str, Any]]:
            from kr8s.asyncio.objects import Pod

            pods = [
                p
                async for p in Pod.list(
                    namespace=self.namespace, label_selector=f"dask.org/cluster-name={self.name}", raw=True
                )
            ]
            # raw=True yields the API's dicts; kr8s's annotation says Pod (and lint runs without kr8s)
            return cast("list[dict[str, Any]]", pods)

        async def _watch_pods(self, began: float, until_worker: bool) -> None:
            """Return once a worker pod runs (if asked); raise ClusterError on a hopeless pod."""
            while True:
                try:
                    pods = await self._list_pods()
                except Exception:  # listing may be forbidden or flaky; the start itself still runs
                    pods = None
                if pods is not None:
                    msg = diagnose_pods(pods, time.monotonic() - began, self._jc_pending_timeout)
                    if msg:
                        raise ClusterError(msg)
                    if until_worker and any(
                        _component(p) == "worker" and (p.get("status") or {}).get("phase") == "Running" for p in pods
                    ):
                        return
                await asyncio.sleep(1.0)

        async def _start(self):
            began = time.monotonic()
            start = asyncio.ensure_future(super()._start())
            watch = asyncio.ensure_future(self._watch_pods(began, until_worker=False))
            try:
                done, _ = await asyncio.wait(
                    {start, watch}, timeout=self._jc_startup_timeout, return_when=asyncio.FIRST_COMPLETED
                )
                if start not in done:
                    start.cancel()
                    with suppress(BaseException):
                        await start
                    if watch in done:
                        watch.result()  # raises the diagnosis
                    raise ClusterError(await self._timeout_message(began))
                start.result()
            except BaseException:
                await self._cleanup()
                raise
            finally:
                watch.cancel()
            if self._jc_expect_workers:
                remaining = max(1.0, self._jc_startup_timeout - (time.monotonic() - began))
                try:
                    await asyncio.wait_for(self._watch_pods(began, until_worker=True), remaining)
                except asyncio.TimeoutError:
                    await self._cleanup()
                    raise ClusterError(await self._timeout_message(began)) from None
                except BaseException:
                    await self._cleanup()
                    raise

        async def _timeout_message(self, began: float) -> str:
            waited = time.monotonic() - began
            with suppress(Exception):
                msg = diagnose_pods(
                    await self._list_pods(), max(waited, self._jc_pending_timeout), self._jc_pending_timeout
                )
                if msg:
                    return msg
            return (
                f"the Kubernetes cluster {self.name!r} did not start within {waited:.0f} s; "
                f"run `kubectl describe daskcluster {self.name}` and `kubectl get pods -l dask.org/cluster-name={self.name}`."
            )

        async def _cleanup(self) -> None:
            # Delete what we created so a failed start leaves nothing running (and billing).
            if self.shutdown_on_close:
                with suppress(BaseException):
                    await asyncio.wait_for(self._close(timeout=30), 35)
            KubeCluster._instances.discard(self)

        async def _adapt(self, minimum=None, maximum=None):
            # dask-kubernetes puts the labels of its DaskAutoscaler into metadata
            # itself; send a well-formed resource instead.
            import kr8s
            from dask_kubernetes.operator._objects import DaskAutoscaler

            body = autoscaler_spec(self.name, minimum or 0, maximum if maximum is not None else max(minimum or 0, 1))
            autoscaler = await DaskAutoscaler(body, self.namespace)
            try:
                await autoscaler.patch({"spec": body["spec"]})
            except kr8s.NotFoundError:
                await autoscaler.create()

    _guarded_class = GuardedKubeCluster
    return GuardedKubeCluster


class KubernetesBackend(Backend):
    """Start a ``DaskCluster`` resource through ``dask_kubernetes.operator.KubeCluster``."""

    name = "kubernetes"
    cli_options = (
        WORKERS,
        Option("image", "the container image of the scheduler and workers", None, "I"),
        Option("namespace", "the Kubernetes namespace", None, "NS"),
        Option("worker_cpu", "CPU each worker pod asks for, like 2 or 500m", None, "C"),
        Option("worker_memory", 'memory each worker pod asks for, like "4Gi"', None, "M"),
        Option("worker_gpu", "GPUs each worker pod asks for", int, "G"),
        Option("env", "environment variables of the pods", None, "KEY=VALUE", kind="list"),
        ADAPT_MIN,
        ADAPT_MAX,
        Option("dry_run", "print the resources' YAML; create nothing", kind="flag"),
    )
    api_options = ("name",)

    def dry_run(self, **options: Any) -> str:
        """YAML of the resources :meth:`start` would create; starts nothing."""
        self.check_options(options)
        options.pop("dry_run", None)
        return dry_run(**options)

    def start(self, **options: Any) -> StartedCluster:
        self.check_options(options)
        if options.pop("dry_run", False):
            raise ClusterError(
                "a dry run starts nothing; call dry_run() (or %cluster start --dry-run) to see the resources."
            )
        opts = _resolved(options)
        spec = cluster_spec(**opts)
        Cluster = _guarded_kube_cluster()
        kwargs: dict[str, Any] = dict(
            name=opts["name"],
            custom_cluster_spec=spec,
            n_workers=opts["workers"],
            image=opts["image"],
            env=opts["env"],
            quiet=True,
            resource_timeout=int(config.timeout_seconds("kubernetes.resource-timeout")),
            startup_timeout=config.timeout_seconds("kubernetes.startup-timeout"),
            pending_timeout=config.timeout_seconds("kubernetes.pending-timeout"),
            expect_workers=opts["workers"] > 0 or bool(opts["adapt_min"]),
        )
        if opts["namespace"]:
            kwargs["namespace"] = opts["namespace"]
        try:
            cluster = Cluster(**kwargs)
        except ClusterError:
            raise
        except Exception as exc:
            msg = explain(exc, opts["namespace"])
            if msg is None:
                raise ClusterError(f"the Kubernetes cluster {opts['name']!r} could not start: {exc}") from exc
            raise ClusterError(msg) from None
        if opts["adapt_min"] is not None:
            try:
                cluster.adapt(minimum=opts["adapt_min"], maximum=opts["adapt_max"])
            except Exception as exc:
                with suppress(Exception):
                    cluster.close()
                raise ClusterError(
                    explain(exc, opts["namespace"]) or f"adaptivity could not be set up: {exc}"
                ) from None
        return StartedCluster.of(cluster)
