"""Launchers: how a sweep's jobs (``jobs.py``) run — here, in processes sharing the cores and GPUs
(``local``), or as Ray tasks (``ray``).

The Ray launcher joins the cluster ``RAY_ADDRESS`` names (one the user started, on the network
they chose), or a Ray session this process already holds. Otherwise it starts a local cluster in
a network namespace of its own that holds only a loopback interface (``closed_network.py``): a
local Ray cluster listens on every interface and its agents look up cloud metadata addresses,
whatever ``ray.init`` is told. Where user namespaces are disabled it refuses, naming both ways
round it.
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import tempfile
from pathlib import Path

from .. import closed_network
from ..children import follow_parent, run_child, stop_children
from ..errors import ConfigError, MechEvalError
from ..atomic_files import write_text_atomic
from ..runs.files import GridSettings
from ..runs import RunDir
from .jobs import execute, job_file_path, job_from_record, job_record
from .progress import ProgressBoard

LAUNCHERS = ("local", "ray")
TICK_SECONDS = 1.0         # how often the launcher looks at the jobs in flight (the board draws when due)


def run_jobs(launcher: str, jobs: list, runs_dir: Path, threads: int, devices: list, progress: bool,
             grid) -> list[dict]:
    """Run every job with ``launcher``; one ``execute`` result per job, in order."""
    if launcher == "local":
        return _launch_local(jobs, runs_dir, threads, devices, progress, grid)
    return _launch_ray(jobs, runs_dir, threads, progress, grid)


PROCESS_MEMORY_GIB = 3     # a generous bound on one training process of the reference presets (CPU)


def plan_workers(workers: int | str = "auto", threads: int | None = None) -> tuple[int, int, list[str | None]]:
    """(processes at once, CPU threads per process, the GPU each process slot sees).

    ``auto``: with GPUs, one process per GPU; on a CPU, one process per core with one thread each,
    as many as memory allows: these models are too small for a second thread to pay
    (``benchmarks/bench_workers.py``, 2 cores: two 1-thread runs train 1.3-1.5x as many steps per
    second as one 2-thread run). A number N: N processes sharing the cores (and the GPUs, in turn).
    ``threads``: threads per process instead of the cores shared out (e.g. one process with one
    thread beside other work that holds the other core)."""
    import torch

    cores = os.cpu_count() or 1
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if workers == "auto":
        if gpus:
            workers = gpus
        else:
            try:
                free_gib = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
            except (ValueError, OSError):   # not on every platform
                free_gib = float("inf")
            workers = max(1, min(cores, int(free_gib // PROCESS_MEMORY_GIB)))
    elif isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ConfigError("workers", f"must be 'auto' or a number of processes >= 1, got {workers!r}")
    if threads is None:
        threads = max(1, cores // workers)
    elif isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError("threads", f"must be a number of threads >= 1, got {threads!r}")
    devices = [str(i % gpus) for i in range(workers)] if gpus else [None] * workers
    return workers, threads, devices


def progress_board(todo, runs_dir, progress: bool) -> ProgressBoard:
    """The board that shows ``todo``'s jobs in flight on stderr (nowhere when not ``progress``)."""
    return ProgressBoard([(job.name, job_file_path(job, Path(runs_dir))) for job in todo],
                         stream=sys.stderr if progress and todo else None)


def training_seconds(results: list[dict], runs_dir) -> dict[str, float | None]:
    """Each run's training wall time (metrics.json), for the board's last lines."""
    seconds = {}
    for result in results:
        for name in result.get("runs", []):
            folder = RunDir(Path(runs_dir) / name)
            try:
                seconds[name] = folder.metrics()["final"].get("train_wall_seconds") if folder.finished else None
            except MechEvalError:
                seconds[name] = None
    return seconds


def _launch_local(todo, runs_dir, threads, devices, progress, grid):
    """One thread per process slot; a job takes a free slot (and its GPU) and gives it back. If
    this process is interrupted, no job starts any more and the running ones are stopped. This
    thread shows the jobs in flight meanwhile (``ProgressBoard``)."""
    import queue
    import threading
    from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

    slots: queue.Queue = queue.Queue()
    for device in devices:
        slots.put(device)
    stopping = threading.Event()
    board = progress_board(todo, runs_dir, progress)

    def in_a_slot(job):
        device = slots.get()
        try:
            if stopping.is_set():
                return {"name": job.name, "runs": job.run_names(), "returncode": -1, "log": "not started"}
            board.started(job.name)
            return execute(job, str(runs_dir), threads, device, grid)
        finally:
            slots.put(device)

    pool = ThreadPoolExecutor(max_workers=len(devices))
    try:
        futures = [pool.submit(in_a_slot, job) for job in todo]
        order = {future: i for i, future in enumerate(futures)}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=TICK_SECONDS, return_when=FIRST_COMPLETED)
            for future in sorted(finished, key=order.get):
                board.ended(future.result())
            board.tick()
        results = [f.result() for f in futures]
        board.close(training_seconds(results, runs_dir))
        return results
    except BaseException:            # Ctrl-C, or any error here: the children must not run on
        stopping.set()
        stop_children()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _launch_ray(todo, runs_dir, threads, progress, grid):
    ray = _import_ray()
    if ray.is_initialized():                 # the caller's own Ray session
        return _on_ray(ray, todo, runs_dir, threads, progress, grid)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if os.environ.get("RAY_ADDRESS"):        # a cluster the user started: its network is theirs
        ray.init(include_dashboard=False, log_to_driver=False)
        try:
            return _on_ray(ray, todo, runs_dir, threads, progress, grid)
        finally:
            ray.shutdown()
    if not todo:
        return []
    return _in_a_closed_local_cluster(todo, runs_dir, threads, progress, grid)


def _import_ray():
    try:
        import ray
    except ImportError:
        raise MechEvalError("the ray launcher needs Ray: pip install 'ray[default]' (hf-mecheval's [ray] extra)") from None
    return ray


def _on_ray(ray, todo, runs_dir, threads, progress, grid) -> list[dict]:
    """The jobs as Ray tasks; the board shows a job from its first progress file (where the
    cluster's machines share the runs folder with this one)."""
    remote = ray.remote(num_cpus=threads, max_retries=2)(execute)
    refs = [remote.remote(job, str(runs_dir), threads, None, grid) for job in todo]
    jobs = dict(zip(refs, todo))
    board = progress_board(todo, runs_dir, progress)
    results: dict = {}
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1, timeout=TICK_SECONDS)
        for ref in ready:
            job = jobs[ref]
            try:
                results[ref] = ray.get(ref)
            except Exception as exc:  # a worker that died beyond its retries
                results[ref] = {"name": job.name, "runs": job.run_names(), "returncode": -1,
                                "log": f"ray: {type(exc).__name__}"}
            board.ended(results[ref])
        board.tick()
    ordered = [results[ref] for ref in refs]
    board.close(training_seconds(ordered, runs_dir))
    return ordered


def _in_a_closed_local_cluster(todo, runs_dir, threads, progress, grid) -> list[dict]:
    """Start ``python -m hf_mecheval.training.launchers JOBS RESULTS`` in a loopback-only network
    namespace: it starts the local cluster there, runs the jobs, and writes their results."""
    problem = closed_network.unavailable()
    if problem:
        raise MechEvalError(f"a local Ray cluster listens on every network interface, so hf-mecheval runs it in a "
                            f"private network namespace, which this machine does not allow: {problem}. Use "
                            f"--launcher local on one machine, or start a Ray cluster yourself and set RAY_ADDRESS")
    with tempfile.TemporaryDirectory(prefix="mecheval-ray-") as tmp:
        jobs_file, results_file = Path(tmp) / "jobs.json", Path(tmp) / "results.json"
        jobs_file.write_text(json.dumps({"jobs": [job_record(j) for j in todo], "runs_dir": str(runs_dir),
                                         "threads": threads, "progress": progress,
                                         "grid": None if grid is None else dataclasses.asdict(grid)}))
        cmd = closed_network.closed_command([sys.executable, "-m", "hf_mecheval.training.launchers",
                                             str(jobs_file), str(results_file)])
        try:
            code = run_child(cmd, _stderr_or_none(), dict(os.environ))
        except BaseException:        # Ctrl-C: the cluster and its trainings must not run on
            stop_children()
            raise
        if code != 0 or not results_file.is_file():
            raise MechEvalError(f"the local Ray cluster stopped before its jobs ended (exit {code})")
        return json.loads(results_file.read_text())


def _stderr_or_none():
    """This process's stderr for a child's output, where it is a real file (not under pytest's capsys)."""
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return None
    return sys.stderr


def _closed_cluster_main(jobs_file: str, results_file: str) -> None:
    """In the closed namespace: loopback up, a local cluster on it, the jobs, their results."""
    follow_parent()
    closed_network.bring_loopback_up()
    spec = json.loads(Path(jobs_file).read_text())
    ray = _import_ray()
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             _node_ip_address="127.0.0.1")
    try:
        results = _on_ray(ray, [job_from_record(j) for j in spec["jobs"]], spec["runs_dir"], spec["threads"],
                          spec["progress"], None if spec["grid"] is None else GridSettings.from_record(spec["grid"]))
    finally:
        ray.shutdown()
    write_text_atomic(Path(results_file), json.dumps(results), overwrite=True)


if __name__ == "__main__":
    _closed_cluster_main(*sys.argv[1:])
