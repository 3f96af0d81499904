"""Search strategies over a task's configuration space, measured with ``kernelrpc.measure``.

Each round, a tuner proposes a batch of configurations it has not measured yet, measures them on
every free device, and learns from the results: ``RandomTuner`` and ``GridSearchTuner`` ignore
them, ``GATuner`` (a genetic algorithm over knob choices, as AutoTVM's) breeds the next batch
from the fastest configurations so far, and ``ModelTuner`` ranks candidates with a cost model
fitted to the measurements.
"""
from __future__ import annotations

import logging
import random

import numpy as np

from ..measure import BuildCache, measure
from ..measure.result import OK
from .space import ConfigEntity

log = logging.getLogger(__name__)


class Tuner:
    def __init__(self, task, seed: int | None = None) -> None:
        self.task = task
        self.space = task.config_space
        self.rng = random.Random(seed)
        self.visited: set[int] = set()
        self.best_config: ConfigEntity | None = None
        self.best_flops = 0.0
        self.best_seconds = float("inf")
        self.seconds: dict[int, float] = {}   # fastest time of each configuration measured
        self.trials = 0
        self.rounds: list[dict] = []          # each measured batch's stats()

    # -- to be provided by a strategy --------------------------------------------------------

    def next_batch(self, size: int) -> list[ConfigEntity]:
        raise NotImplementedError

    def update(self, config: ConfigEntity, result) -> None:
        """Learn from one measurement (the default keeps only the best)."""

    # -- shared --------------------------------------------------------------------------------

    def has_next(self) -> bool:
        return len(self.visited) < len(self.space)

    @property
    def default_seconds(self) -> float | None:
        """The fastest time of the template's default configuration (index 0), once measured."""
        return self.seconds.get(0)

    def _record(self, config: ConfigEntity, result) -> None:
        self.visited.add(config.index)
        if result.status == OK:
            median = result.profile.median
            self.seconds[config.index] = min(median, self.seconds.get(config.index, median))
            if median < self.best_seconds:
                self.best_seconds = median
                self.best_flops = result.gflops or 0.0
                self.best_config = config
        self.update(config, result)

    def load_history(self, records) -> int:
        """Take in earlier measurements of this task on its target (a resumed log, which boards
        of the same target share): they are not measured again. Another target's records are
        left out."""
        from types import SimpleNamespace

        from ..runtime.profile import ProfileResult
        from .record import same_target

        workload = [self.task.name, *self.task.args]
        count = 0
        for record in records:
            if record["workload"] != workload or not same_target(record, self.task.target):
                continue
            try:
                config = self.space.from_values(record["config"]["knobs"])
            except ValueError:
                continue
            res = record["result"]
            profile = ProfileResult(res["costs"], 1) if res["costs"] else None
            result = SimpleNamespace(status=res["status"], profile=profile, gflops=res.get("gflops"),
                                     error=res.get("error", ""))
            self._record(config, result)
            count += 1
        return count

    def tune(self, n_trial: int, measure_option: dict, early_stopping: int | None = None,
             callbacks=(), batch_size: int | None = None, inputs=None,
             confirm: int = 0, wait_for_builds: bool = False, stop=None) -> ConfigEntity | None:
        """Measure up to ``n_trial`` new configurations; returns the best configuration seen.

        ``early_stopping``: stop after that many trials without a better result. ``inputs``:
        arrays for the leading arguments (default: seeded random values of the argument shapes).
        ``confirm``: afterwards, measure the default and the ``confirm`` fastest configurations
        once more (logged too); each configuration's time is the fastest of its measurements,
        so that one measurement slowed by another process on the device does not decide.
        Those are not built again: every build of the call is kept (a ``BuildCache``) by
        what it was built from, and on a process pool configurations that lower to the same
        kernel share one compile and link. ``wait_for_builds``: a round requests its devices once all its
        candidates are built (``kernelrpc.measure``'s option; ``tune_tasks`` builds one task's
        round while another's measures). ``stop``: a ``threading.Event``; once set, no
        further round starts.
        """
        runner, builder = measure_option["runner"], measure_option["builder"]
        task = self.task
        n_in = task.n_inputs
        if inputs is None:
            data_rng = np.random.default_rng(0)
            inputs = [data_rng.random(shape).astype(dtype) if np.dtype(dtype).kind == "f"
                      else data_rng.integers(0, 8, shape).astype(dtype)
                      for shape, dtype in task.arg_specs[:n_in]]
            if task.prepare_inputs is not None:
                inputs = task.prepare_inputs(inputs)
        if task.reference is None:
            log.warning("task %s has no reference: outputs are not checked", task.name)
        reference = None if task.reference is None else task.reference(*inputs)
        atol = runner.atol
        if task.scale_atol and reference is not None:
            outputs = reference if isinstance(reference, (list, tuple)) else [reference]
            atol = max(atol, task.scale_atol * max(float(np.abs(o).max()) for o in outputs))
        batch_size = batch_size or max(8, 4 * (runner.max_devices or 2))
        executor = builder.executor
        own_executor = executor is None
        if own_executor:
            from ..measure import default_executor
            executor = default_executor()          # one pool for every round: workers start once

        kernels = _shared_directory(executor)
        cache = BuildCache(directory=kernels and kernels.name)

        def measure_batch(configs):
            return self._measure(configs, runner, executor, inputs, reference, callbacks,
                                 cache, wait_for_builds, atol)
        try:
            self._tune(n_trial, measure_batch, early_stopping, batch_size, stop)
            if confirm > 0 and not (stop is not None and stop.is_set()):
                ranked = sorted(self.seconds, key=self.seconds.get)[:confirm]
                again = [0, *(i for i in ranked if i != 0)] if 0 in self.visited else ranked
                for _ in measure_batch([self.space.get(i) for i in again]):
                    pass
        finally:
            if own_executor:
                executor.shutdown(wait=False, cancel_futures=True)
            if kernels is not None:
                kernels.cleanup()
        return self.best_config

    def _measure(self, configs, runner, executor, inputs, reference, callbacks, cache=None,
                 wait_for_builds=False, atol=None):
        """Measure ``configs`` in one batch (outputs within ``atol``, default the runner's, of
        the reference); yields each ``(config, result)`` once recorded."""
        task = self.task
        by_name = {}
        candidates = []
        for config in configs:
            fn = task.candidate(config)
            by_name[fn.__name__] = config
            candidates.append((fn.__name__, fn))
        batch = measure(candidates, key=runner.key, tracker=(runner.host, runner.port),
                        inputs=inputs, reference=reference, target=task.target, name="main",
                        number=runner.number, repeat=runner.repeat,
                        min_repeat_ms=runner.min_repeat_ms, timeout=runner.timeout,
                        session_timeout=runner.session_timeout, executor=executor,
                        max_devices=runner.max_devices, flops=task.flop, rtol=runner.rtol,
                        atol=runner.atol if atol is None else atol,
                        priority=runner.priority, board_wait=runner.board_wait, build_cache=cache,
                        wait_for_builds=wait_for_builds)
        for result in batch:
            config = by_name[result.name]
            self._record(config, result)
            for callback in callbacks:
                callback(self, config, result)
            yield config, result
        self.rounds.append(batch.stats())

    def _tune(self, n_trial, measure_batch, early_stopping, batch_size, stop=None):
        since_best = 0
        measured = 0
        while measured < n_trial and self.has_next() and not (stop is not None and stop.is_set()):
            configs = self._with_default(self.next_batch(min(batch_size, n_trial - measured)))
            if not configs:
                break
            before = self.best_seconds
            for _ in measure_batch(configs):
                measured += 1
                self.trials += 1
                since_best = 0 if self.best_seconds < before else since_best + 1
                before = self.best_seconds
            if early_stopping is not None and since_best >= early_stopping:
                log.info("no better configuration in %d trials: stopping", since_best)
                break

    def _with_default(self, batch: list) -> list[ConfigEntity]:
        """The batch, led by the template's default configuration (every knob's first choice)
        until it has been measured: a tuned result is never worse than the default's."""
        if 0 in self.visited or any(c.index == 0 for c in batch):
            return batch
        return [self.space.get(0), *batch[:-1]] if batch else batch

    def _fill_random(self, batch: list, chosen: set, size: int) -> list[ConfigEntity]:
        """``batch`` topped up to ``size`` with random unvisited configurations not in ``chosen``."""
        while len(batch) < size:
            config = self._random_unvisited(chosen)
            if config is None:
                break
            chosen.add(config.index)
            batch.append(config)
        return batch

    def _random_unvisited(self, exclude: set) -> ConfigEntity | None:
        total = len(self.space)
        for _ in range(64):
            index = self.rng.randrange(total)
            if index not in self.visited and index not in exclude:
                return self.space.get(index)
        for index in range(total):               # a nearly exhausted space: scan
            if index not in self.visited and index not in exclude:
                return self.space.get(index)
        return None


def _shared_directory(executor):
    """A directory for the libraries the build workers link (``BuildCache(directory=)``), when
    they are processes of this host; None for another executor (a Dask cluster's), which then
    builds every candidate, as logged."""
    import concurrent.futures
    import tempfile

    if isinstance(executor, concurrent.futures.ProcessPoolExecutor):
        return tempfile.TemporaryDirectory(prefix="kernelrpc-kernels-")
    log.info("builds on %s: kernels that lower to the same code are each built (the build "
             "cache's directory is for a process pool of this host)", type(executor).__name__)
    return None


class RandomTuner(Tuner):
    """Configurations drawn uniformly, without repeats."""

    def next_batch(self, size: int) -> list[ConfigEntity]:
        return self._fill_random([], set(), size)


class GridSearchTuner(Tuner):
    """Every configuration in index order."""

    def __init__(self, task, seed: int | None = None) -> None:
        super().__init__(task, seed)
        self._next = 0

    def next_batch(self, size: int) -> list[ConfigEntity]:
        batch = []
        while len(batch) < size and self._next < len(self.space):
            if self._next not in self.visited:
                batch.append(self.space.get(self._next))
            self._next += 1
        return batch


class GATuner(Tuner):
    """A genetic algorithm over knob choices: the fittest (highest throughput) configurations
    breed by uniform crossover, each knob mutates with ``mutation_prob``; the first generation and
    any shortfall are random. Failed configurations have fitness zero."""

    def __init__(self, task, pop_size: int = 32, elite_num: int = 4, mutation_prob: float = 0.1,
                 seed: int | None = None) -> None:
        super().__init__(task, seed)
        self.pop_size = pop_size
        self.elite_num = elite_num
        self.mutation_prob = mutation_prob
        self.scores: dict[int, float] = {}

    def update(self, config: ConfigEntity, result) -> None:
        self.scores[config.index] = 1.0 / result.profile.median if result.status == OK else 0.0

    def next_batch(self, size: int) -> list[ConfigEntity]:
        ranked = sorted((i for i, s in self.scores.items() if s > 0), key=self.scores.get, reverse=True)
        parents = ranked[:self.pop_size]
        batch, chosen = [], set()
        if len(parents) >= 2:
            weights = [self.scores[i] for i in parents]
            dims = self.space.dims
            genes = {i: self.space.indices_of(i) for i in parents}
            for _ in range(size * 20):
                if len(batch) >= size:
                    break
                a, b = self.rng.choices(parents, weights=weights, k=2)
                child = [ga if self.rng.random() < 0.5 else gb for ga, gb in zip(genes[a], genes[b])]
                child = [self.rng.randrange(d) if self.rng.random() < self.mutation_prob else g
                         for g, d in zip(child, dims)]
                index = self.space.index_of(child)
                if index not in self.visited and index not in chosen:
                    chosen.add(index)
                    batch.append(self.space.get(index))
        return self._fill_random(batch, chosen, size)


class ModelTuner(Tuner):
    """Model-guided search: a ridge regression of log throughput on the knob choices (one-hot,
    with pairwise products, so that knobs that only pay off together are seen) ranks a pool of
    random and mutated unvisited configurations; each batch takes the best-ranked ones plus an
    ``epsilon`` share of random ones. Until ``warmup`` results are in, batches are random.

    A small stand-in for AutoTVM's XGBoost cost model that needs nothing beyond numpy.
    """

    def __init__(self, task, warmup: int = 16, pool_size: int = 2048, epsilon: float = 0.1,
                 ridge: float = 1.0, seed: int | None = None) -> None:
        super().__init__(task, seed)
        self.warmup = warmup
        self.pool_size = pool_size
        self.epsilon = epsilon
        self.ridge = ridge
        self.scores: dict[int, float] = {}
        self._offsets = np.cumsum([0, *self.space.dims[:-1]])
        self._width = sum(self.space.dims)

    def update(self, config: ConfigEntity, result) -> None:
        self.scores[config.index] = 1.0 / result.profile.median if result.status == OK else 0.0

    def _features(self, indices: list[list[int]]) -> np.ndarray:
        onehot = np.zeros((len(indices), self._width))
        for row, genes in enumerate(indices):
            onehot[row, self._offsets + np.asarray(genes)] = 1.0
        upper = np.triu_indices(self._width, 1)
        pairs = (onehot[:, :, None] * onehot[:, None, :])[:, upper[0], upper[1]]
        return np.hstack([np.ones((len(indices), 1)), onehot, pairs])

    def _fit(self) -> np.ndarray:
        good = [s for s in self.scores.values() if s > 0]
        floor = np.log(min(good)) - 1.0 if good else 0.0
        indices = list(self.scores)
        x = self._features([self.space.indices_of(i) for i in indices])
        y = np.array([np.log(self.scores[i]) if self.scores[i] > 0 else floor for i in indices])
        return np.linalg.solve(x.T @ x + self.ridge * np.eye(x.shape[1]), x.T @ y)

    def _pool(self) -> list[int]:
        pool: set[int] = set()
        dims = self.space.dims
        top = sorted(self.scores, key=self.scores.get, reverse=True)[:16]
        for _ in range(self.pool_size * 2):
            if len(pool) >= self.pool_size:
                break
            if top and self.rng.random() < 0.5:
                genes = self.space.indices_of(self.rng.choice(top))
                knob = self.rng.randrange(len(dims))
                genes[knob] = self.rng.randrange(dims[knob])
                index = self.space.index_of(genes)
            else:
                index = self.rng.randrange(len(self.space))
            if index not in self.visited:
                pool.add(index)
        return list(pool)

    def next_batch(self, size: int) -> list[ConfigEntity]:
        if len(self.scores) < self.warmup or not any(self.scores.values()):
            return RandomTuner.next_batch(self, size)
        weights = self._fit()
        pool = self._pool()
        predicted = self._features([self.space.indices_of(i) for i in pool]) @ weights
        ranked = [pool[i] for i in np.argsort(-predicted)]
        greedy = ranked[:max(1, int(round(size * (1 - self.epsilon))))]
        batch = [self.space.get(i) for i in greedy]
        chosen = set(greedy)
        return self._fill_random(batch, chosen, size)
