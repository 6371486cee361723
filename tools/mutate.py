"""Mutation testing by hand-picked mutants: does the suite notice a plausible bug?

Each mutant is one textual change to one source file, the tests that should catch it,
and why it matters. For each, the tracked files are copied to a scratch directory, the
change is applied there, and the tests run against that copy (its source directories
go first on PYTHONPATH, so the editable installs of the working tree are shadowed). A
mutant that passes its tests *survives*: the suite has a hole there.

    python tools/mutate.py            # every mutant (several minutes)
    python tools/mutate.py fitter     # the mutants whose name starts with "fitter"
    python tools/mutate.py --list

Not run in CI (too slow). Run it before resolving an issue that touches the fitter, the
planner, the runner, the statistics or the Triton kernels, and put its result in the
note.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ["diffract_core/src", "diffract_kernels_spectral/src", "kernel_fun_gpu/src",
           "diffract_kernels_alignment/src", *(f"plugins/{p}/src" for p in (
               "diffract_storage_local", "diffract_formats", "diffract_report", "diffract_views",
               "diffract_executor_dask", "diffract_executor_ray", "diffract_training",
               "diffract_sources_fsspec")), "."]

SPECTRAL = "diffract_kernels_spectral/src/diffract_kernels_spectral/"
CORE = "diffract_core/src/diffract/core/"
FITTER_TESTS = ["tests/spectral/test_fitter_exactness.py", "tests/spectral/test_fitting.py"]
STATS_TESTS = ["tests/spectral/test_statistics.py", "tests/spectral/test_fitting.py"]
CORE_TESTS = ["tests/core"]
CONV_TESTS = ["tests/kernel_fun_gpu/test_cconv.py"]
CONV = "kernel_fun_gpu/src/kernel_fun/ops/cconv/_triton.py"
KDA = "kernel_fun_gpu/src/kernel_fun/ops/kda/_triton.py"
KDA_TESTS = ["tests/kernel_fun_gpu/test_kda.py::TestAgainstFlaNaive"]
TRAINING = "plugins/diffract_training/src/diffract_training/"
FORMATS = "plugins/diffract_formats/src/diffract_formats/"
FSSPEC = "plugins/diffract_sources_fsspec/src/diffract_sources_fsspec/"


@dataclass(frozen=True)
class Mutant:
    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    why: str


MUTANTS = [
    Mutant("views-multi-query-kv-from-num-kv-heads",
           "plugins/diffract_views/src/diffract_views/rules.py",
           'kv = (options.get("kv_heads") or (1 if mqa else None)',
           'kv = (options.get("kv_heads") or None', ("tests/views",),
           "Falcon-7B's one key-value head taken as num_kv_heads"),
    Mutant("views-towers-share-one-config", "plugins/diffract_views/src/diffract_views/rules.py",
           "            return config[key]\n", "            pass\n", ("tests/views",),
           "a multimodal model's towers read the top-level configuration"),
    Mutant("views-latent-attention-ignored", "plugins/diffract_views/src/diffract_views/rules.py",
           'latent = None if options.get("head_dim") else _latent(config)',
           "latent = None", ("tests/views",), "DeepSeek-V3's heads by hidden / heads"),
    Mutant("views-codegen-as-blocks", "plugins/diffract_views/src/diffract_views/rules.py",
           'if config.get("model_type") == "codegen":', "if False:", ("tests/views",),
           "CodeGen's sharded qkv_proj read as q|k|v blocks"),
    Mutant("views-layer-types-ignored", "plugins/diffract_views/src/diffract_views/rules.py",
           '    layer = "" if options.get("patterns") else _layer_type(config, name)\n'
           "    if kind is None", '    layer = ""\n    if kind is None', ("tests/views",),
           "a hybrid model's linear-attention and convolution layers split as attention"),
    Mutant("views-experts-turned-by-default", "plugins/diffract_views/src/diffract_views/rules.py",
           'return "in_out" if config.get("model_type") in _IN_OUT_EXPERTS else "out_in"',
           'return "out_in" if config.get("model_type") in _IN_OUT_EXPERTS else "in_out"',
           ("tests/views/test_rules.py",),
           "experts without expert_layout read [E, in, out] as if they were [E, out, in]"),
    Mutant("steps-name-over-trainer-state", "diffract_core/src/diffract/core/steps.py",
           "        record.update(_from_path(path))\n        record.update({} if url_scheme(text) "
           "else _trainer_state(path))",
           "        record.update({} if url_scheme(text) else _trainer_state(path))\n"
           "        record.update(_from_path(path))",
           ("tests/core/test_steps.py",), "a folder's name overrides its trainer_state.json"),
    Mutant("onnx-any-use-turns", "plugins/diffract_formats/src/diffract_formats/onnx_reader.py",
           "turn = len(init.dims) == 2 and said == {True}",
           "turn = len(init.dims) == 2 and True in said",
           ("tests/formats/test_more_formats.py",),
           "an initializer a Gather also reads is turned by its MatMul use"),
    Mutant("onnx-gemm-transb-default-1", "plugins/diffract_formats/src/diffract_formats/onnx_reader.py",
           'return not attributes.get("transB", 0)', 'return not attributes.get("transB", 1)',
           ("tests/formats/test_more_formats.py",),
           "a Gemm without transB is read as transB=1 (its default is 0)"),
    Mutant("gguf-no-kv-head-count", "plugins/diffract_formats/src/diffract_formats/gguf_reader.py",
           '"attention.head_count_kv": "num_key_value_heads",', '',
           ("tests/formats/test_more_formats.py",),
           "GGUF's head_count_kv not read: k and v split into the query head count"),
    Mutant("store-full-sync-skips-the-rename", "plugins/diffract_storage_local/src/diffract_storage_local/_directory.py",
           '            if self.sync == "full" and hasattr(os, "O_DIRECTORY"):  # the rename, too',
           '            if False:  # the rename, too',
           ("tests/storage/test_local.py",),
           "sync='full' leaves an array file's rename unsynced: power loss loses its name"),
    Mutant("one-blas-thread-not-pinned", SPECTRAL + "linalg.py",
           "        bundled.set_threads(1)\n", "        bundled.set_threads(before)\n",
           ("tests/spectral/test_same_bits.py",),
           "the decompositions run on every BLAS thread: float32 bits depend on the path"),
    Mutant("compare-counts-the-last-pair", "plugins/diffract_report/src/diffract_report/compare.py",
           "                reports += by_pair.values()",
           "                reports += list(by_pair.values())[-1:]",
           ("tests/core/test_cli_analyze.py",),
           "compare counts only the last pair's failures: a failing first pair exits 0"),
    Mutant("mp-fitted-no-tw-allowance", SPECTRAL + "kernels.py",
           "int(np.sum(scaled > edge + allowance)))", "int(np.sum(scaled > edge)))",
           ("tests/spectral/test_diagnostics.py",),
           "bulk='fitted' counts spikes from the edge, without WeightWatcher's TW allowance"),
    Mutant("matrix-rank-min-side", SPECTRAL + "kernels_ww.py",
           "    big = max(view(shape, conv)[:2])", "    big = min(view(shape, conv)[:2])",
           ("tests/spectral/test_diagnostics.py",),
           "matrix_rank's tolerance by the shorter side: tiny directions counted"),
    Mutant("filter-re-anchored", "diffract_core/src/diffract/core/scope.py",
           "return lambda name: rx.search(name) is not None",
           "return lambda name: rx.match(name) is not None",
           ("tests/core/test_models.py",), "re: filters anchored at the start, not searched"),
    Mutant("gpt2-conv1d-typed-conv", "diffract_core/src/diffract/core/ptypes.py",
           'if kind.startswith("conv") and len(shape) != 2:', 'if kind.startswith("conv"):',
           ("tests/core/test_parity.py",), "GPT-2's Conv1D (a linear map) is typed conv"),
    Mutant("fields-list-not-unpacked", "diffract_core/src/diffract/core/scope.py",
           "if len(fields) == 1 and isinstance(fields[0], (list, tuple)):",
           "if False:", ("tests/core/test_friction.py",), "apply(['a', 'b']) is refused"),
    Mutant("folder-of-checkpoints-not-caught",
           "plugins/diffract_report/src/diffract_report/_inputs.py",
           "if not url_scheme(raw) and os.path.isdir(raw) and not is_checkpoint(path):",
           "if False:",
           ("tests/core/test_cli_analyze.py",),
           "analyze runs/ answers with the formats' list, not with what to type"),
    Mutant("filter-label-is-a-class", "diffract_core/src/diffract/core/scope.py",
           'lambda m: f"[[]{m.group(1)}[]]", pattern)', 'lambda m: m.group(0), pattern)',
           ("tests/core/test_models.py",), "a view's label in a glob read as a class"),
    Mutant("merge-theirs-skips-aggregates", "diffract_core/src/diffract/merge.py",
           "            aggregates.update(plan.conflicting_aggregates)\n", "",
           ("tests/core/test_parity.py",),
           "on_conflict='theirs' takes their per-parameter values but keeps our aggregates"),
    Mutant("store-tuple-unchecked", "plugins/diffract_storage_local/src/diffract_storage_local/_codec.py",
           "with np.load(io.BytesIO(_verified(path).tobytes()), allow_pickle=False) as archive:",
           "with np.load(path, allow_pickle=False) as archive:",
           ("tests/storage/test_local.py",),
           "a stored tuple's .npz read without its checksum: zipfile's error or wrong values"),
    # -- FARMS as its paper's code places the windows (issue 36) ---------------------------
    Mutant("farms-even-placement-by-default", SPECTRAL + "kernels_pruning.py",
           'placement: Literal["paper", "even"] = "paper",',
           'placement: Literal["paper", "even"] = "even",',
           ("tests/spectral/test_estimators.py",),
           "the windows end flush with the edge, not where the paper's code puts them"),
    Mutant("farms-round-the-step", SPECTRAL + "kernels_pruning.py",
           "step = max(1, room // (per_dim - 1))", "step = max(1, round(room / (per_dim - 1)))",
           ("tests/spectral/test_estimators.py",),
           "the paper's step is floor(room / 9), not rounded"),
    # -- the fitter's pruning and definitions -----------------------------------------
    Mutant("fitter-bounds-too-tight", SPECTRAL + "_taichi_kernels.py",
           "gap = ti.abs(t - ti.cast(grid_first[g] - s, ti.f64) * inv_m)",
           "gap = 1.02 * ti.abs(t - ti.cast(grid_first[g] - s, ti.f64) * inv_m)",
           tuple(FITTER_TESTS), "lower bounds 2% too high prune candidates that could win"),
    Mutant("fitter-hint-gap-too-high", SPECTRAL + "_taichi_kernels.py",
           "near = ti.abs(t - ti.cast(grid_first[g] - s, ti.f64) * inv_m)",
           "near = 1.05 * ti.abs(t - ti.cast(grid_first[g] - s, ti.f64) * inv_m)",
           tuple(FITTER_TESTS), "the gaps next to a hint, 5% too high, prune a winner"),
    Mutant("fitter-exact-hint-too-high", SPECTRAL + "_taichi_kernels.py",
           "            if ti.abs(th - ah) > d:\n                d = ti.abs(th - ah)\n",
           "            if ti.abs(th - ah) > d:\n                d = 1.05 * ti.abs(th - ah)\n",
           tuple(FITTER_TESTS), "the exact scan's first gaps, 5% too high, lose the winner"),
    Mutant("objects-outside-the-prefix-read",
           "plugins/diffract_sources_fsspec/src/diffract_sources_fsspec/objects.py",
           'if not target.startswith(base + "/"):', "if False:",
           ("tests/sources/test_objects.py",),
           "a shard index naming ../other/x.safetensors reads an object outside the prefix"),
    Mutant("objects-version-tag-ignored", "diffract_core/src/diffract/core/sources.py",
           "else None if tag == self.etag else", "else None if True else",
           ("tests/sources/test_objects.py",),
           "an object rewritten with the same size is read as the one added"),
    Mutant("objects-read-to-the-end",
           "plugins/diffract_sources_fsspec/src/diffract_sources_fsspec/objects.py",
           "stop = self._size if n is None or n < 0 else min(self._size, self._at + n)",
           "stop = self._size",
           ("tests/sources/test_objects.py",),
           "each read fetches the rest of the object: a tensor's read moves the checkpoint"),
    Mutant("views-after-every-parent", CORE + "compute/chunking.py",
           "costed.sort(key=lambda pair: own.get(self._parent(pair[1]), pair[0]), reverse=True)",
           "costed.sort(key=lambda pair: pair[0], reverse=True)",
           ("tests/sources/test_objects.py",),
           "views run after every parent, which has left the recent ones: each view is read again"),
    Mutant("views-in-tasks-of-their-own", CORE + "compute/runner.py",
           "or info is not None and info.parent in held):",
           "or False and info.parent in held):",
           ("tests/sources/test_objects.py",),
           "a pool worker that runs a view reads its slice again, its parent read by another"),
    Mutant("kernels-read-apart", CORE + "compute/runner.py",
           "together = read_together(plan.steps)", "together = [(s, ()) for s in plan.steps]",
           ("tests/core/test_execution.py", "tests/sources/test_objects.py"),
           "kernels that read the same weights each read them: the esd and svd of track "
           "fetch every tensor twice from object storage"),
    Mutant("together-before-its-inputs", CORE + "compute/runner.py",
           "reads & needs and not made & needs", "reads & needs",
           ("tests/core/test_execution.py",),
           "a kernel joins an earlier one although it reads what a step between them makes: "
           "its input is not there yet"),
    Mutant("a-units-kernels-in-tasks-apart", CORE + "compute/runner.py",
           "runnable[tasks[-1][-1]][0] == unit", "False",
           ("tests/sources/test_objects.py",),
           "in the pool a unit's kernels run in different tasks: each worker reads the unit"),
    Mutant("weights-read-per-kernel", CORE + "compute/inputs.py",
           "read, key = {} if read is None else read, (field, model_id, param)",
           "read, key = {}, (field, model_id, param)",
           ("tests/core/test_execution.py", "tests/sources/test_objects.py"),
           "in this process each kernel of a unit reads its weights again"),
    Mutant("worker-reads-per-kernel", CORE + "compute/worker.py",
           "outcomes.append(invoke(fn, got, config, read))",
           "outcomes.append(invoke(fn, got, config))",
           ("tests/sources/test_objects.py",),
           "a worker running a unit's kernels reads the unit once for each"),
    Mutant("remote-workers-sent-the-objects", CORE + "compute/inputs.py",
           "lazy is True or url_scheme(source.path)", "lazy is True",
           ("tests/sources/test_objects.py",),
           "a remote cluster's workers get every weight from the session, also those in "
           "object storage they can fetch themselves"),
    Mutant("remote-dask-reads-no-urls",
           "plugins/diffract_executor_dask/src/diffract_executor_dask/executor.py",
           'return True if options.get("address") is None else "urls"',
           'return options.get("address") is None',
           ("tests/sources/test_objects.py",),
           "a Dask cluster by address ships the weights of a checkpoint in object storage"),
    Mutant("track-vectors-apart-from-the-metrics",
           "plugins/diffract_report/src/diffract_report/track.py",
           "fresh = [m for m in ids if m in new] if svd",
           "fresh = [] if svd",
           ("tests/sources/test_objects_cli.py",),
           "track computes the singular vectors in their own step: each tensor fetched twice"),
    Mutant("track-threshold-only-in-the-environment",
           "plugins/diffract_report/src/diffract_report/_allocator.py",
           "if libc.mallopt(_M_MMAP_THRESHOLD, THRESHOLD) != 1:", "if False:",
           ("tests/core/test_track_memory.py",),
           "the workers would inherit the threshold but the track's own process keeps "
           "every freed buffer"),
    Mutant("fitter-threads-for-small-sets", SPECTRAL + "_search.py",
           "threads = max(len(x) for x in xs) >= PARALLEL_FROM", "threads = True",
           tuple(FITTER_TESTS), "small sets stay off Taichi's threads (a busy machine "
           "delays every launch for a thread that has nothing to do)"),
    Mutant("fitter-drop-a-survivor", SPECTRAL + "_search.py",
           "alphas, peak, best[cand_set]), untouched])",
           "alphas, peak, best[cand_set]), untouched])[1:]",
           tuple(FITTER_TESTS), "one survivor of a bounds pass is never scanned"),
    Mutant("fitter-near-peak-too-eager", SPECTRAL + "_search.py",
           "kept.append(part[gap - 1e-12 <= best[part]])",
           "kept.append(part[gap - 1e-12 <= 0.5 * best[part]])",
           tuple(FITTER_TESTS), "the checks next to peaks drop candidates that could win"),
    Mutant("fitter-near-peak-too-eager-slightly", SPECTRAL + "_search.py",
           "kept.append(part[gap - 1e-12 <= best[part]])",
           "kept.append(part[gap <= 0.98 * best[part]])", tuple(FITTER_TESTS),
           "a relative tolerance: the checks next to peaks drop near-ties within 2% of the best"),
    Mutant("fitter-candidate-off-by-one", SPECTRAL + "_search.py",
           "return distinct[(n - distinct) >= min_tail]", "return distinct[(n - distinct) > min_tail]",
           tuple(FITTER_TESTS), "the last candidate (tail of exactly min_tail) is lost"),
    Mutant("fitter-dense-staircase-too-high", SPECTRAL + "_search.py",
           "cols = every[np.searchsorted(every, s.min()):]",
           "cols = every[np.searchsorted(every, s.max()):]",
           tuple(FITTER_TESTS), "a block of the dense pass must keep the points of its first xmin"),
    Mutant("fits-small-on-threads", SPECTRAL + "kernels_fits.py",
           "return (THREADED_MIN_POINTS <= n <= DENSE_MAX_POINTS",
           "return (n <= DENSE_MAX_POINTS",
           ("tests/spectral/test_lapack.py",),
           "spectra too small to pay for threads fitted on them (slower; MiniLM's 384 points)"),
    Mutant("fitter-budget-drops", SPECTRAL + "_taichi_kernels.py",
           "if lo > stop_above or left == 0:\n                break",
           "if left == 0:\n                lo = stop_above + 1.0\n"
           "            if lo > stop_above or left == 0:\n                break",
           tuple(FITTER_TESTS), "a candidate whose budget ran out is not beaten: it goes on"),
    Mutant("fitter-grid-of-the-first-set", SPECTRAL + "_search.py",
           "o, last, b, to = offsets[sets], counts[sets] - 1, base[sets], base[sets + 1]",
           "o, last, b, to = offsets[sets], counts[sets] - 1, 0, base[sets + 1]",
           tuple(FITTER_TESTS), "a batch's later sets must be bounded on their own grids"),
    Mutant("fitter-exact-scan-skips", SPECTRAL + "_taichi_kernels.py",
           "if ti.max(t - prev_a, a - prev_t) + 1e-12 > d:",
           "if ti.max(t - prev_a, a - prev_t) > d + 1e-3:",
           tuple(FITTER_TESTS), "the exact scan skips intervals that hold the maximum gap"),
    Mutant("fitter-ties-to-largest-xmin", SPECTRAL + "_search.py",
           "return int(order[winners].min())", "return int(order[winners].max())",
           tuple(FITTER_TESTS), "exact ties must go to the smallest xmin"),
    Mutant("fitter-ties-small-path", SPECTRAL + "_search.py",
           "winners = [_smallest_winner(orders[i], dist[cbase[i]:cbase[i + 1]])",
           "winners = [int(orders[i][np.argmin(dist[cbase[i]:cbase[i + 1]])])",
           tuple(FITTER_TESTS), "with few candidates too, ties go to the smallest xmin"),
    Mutant("fitter-threshold-shared-by-replicates", SPECTRAL + "_search.py",
           "np.minimum.at(best, cand_set[idx], out)", "best[:] = min(best.min(), out.min())",
           ("tests/spectral/test_diagnostics.py",),
           "a batched search's threshold must be each data set's own"),
    Mutant("fitter-dense-keeps-below-xmin", SPECTRAL + "_search.py",
           "gap[cols[None, :] < s[:, None]] = 0.0",
           "gap[cols[None, :] < s[:, None] - 1] = 0.0",
           tuple(FITTER_TESTS), "the dense pass must ignore points below the candidate"),
    Mutant("fitter-right-ecdf", SPECTRAL + "_search.py",
           "return values, first / len(tail)",
           "return values, np.searchsorted(tail, values, side='right') / len(tail)",
           tuple(FITTER_TESTS), "the KS definition uses the empirical CDF just below u"),
    Mutant("fitter-alpha-minus-one", SPECTRAL + "_search.py",
           "    alpha = 1.0 + len(tail) / np.sum(np.log(tail / xmin))\n    return float(alpha)",
           "    alpha = len(tail) / np.sum(np.log(tail / xmin))\n    return float(alpha)",
           tuple(FITTER_TESTS), "the MLE is 1 + n / sum ln(x / xmin)"),
    # -- statistics ---------------------------------------------------------------------
    Mutant("stats-vuong-scale", SPECTRAL + "significance.py",
           "erfc(abs(r) / (math.sqrt(2.0 * m) * s))", "erfc(abs(r) / (math.sqrt(m) * s))",
           tuple(STATS_TESTS), "Vuong's statistic is R / (sqrt(n) s), erfc of it over sqrt 2"),
    Mutant("stats-wilks-factor", SPECTRAL + "significance.py",
           "chi2.sf(2.0 * abs(r), 1)", "chi2.sf(abs(r), 1)",
           tuple(STATS_TESTS), "Wilks: 2 |R| is chi2 with one degree of freedom"),
    Mutant("stats-exp-ks-shift", SPECTRAL + "fitting.py",
           "d = _ks(tail, lambda u: 1.0 - np.exp(-lam * (u - xmin)))",
           "d = _ks(tail, lambda u: 1.0 - np.exp(-lam * u))",
           tuple(STATS_TESTS), "the exponential's CDF starts at xmin"),
    Mutant("stats-bootstrap-direction", SPECTRAL + "significance.py",
           "hits = sum(d >= fit.ks_distance for d in distances)",
           "hits = sum(d <= fit.ks_distance for d in distances)",
           tuple(STATS_TESTS), "the p-value counts replicates at least as far from a power law"),
    Mutant("stats-bootstrap-fixed-seed", SPECTRAL + "significance.py",
           "rng = np.random.default_rng(seed)\n    body = x[x < fit.xmin]",
           "rng = np.random.default_rng(0)\n    body = x[x < fit.xmin]",
           tuple(STATS_TESTS), "the seed must drive the bootstrap"),
    Mutant("stats-fixed-xmin-bootstrap-seed", SPECTRAL + "significance.py",
           "rng = np.random.default_rng(seed)\n    n = len(x)",
           "rng = np.random.default_rng(0)\n    n = len(x)",
           ("tests/spectral/test_pvalue_fixed.py",), "the seed drives the fixed-xmin bootstrap"),
    Mutant("stats-stable-rank", SPECTRAL + "kernels.py",
           "return float(np.sum(values) / values[-1])", "return float(np.sum(values) / values[0])",
           ("tests/spectral/test_kernels.py",), "stable rank divides by the largest eigenvalue"),
    # -- the planner ----------------------------------------------------------------------
    Mutant("planner-param-any-output", CORE + "compute/planner.py",
           "any_out = set().union(*have.values())", "any_out = set.intersection(*have.values())",
           tuple(CORE_TESTS), "a parameter is pending only when all outputs are absent"),
    Mutant("planner-model-any-output", CORE + "compute/planner.py",
           "                if not any(present) or (spec.name, (model_id,), None) in forced:",
           "                if not all(present) or (spec.name, (model_id,), None) in forced:",
           tuple(CORE_TESTS), "the same rule for IN_MODEL kernels"),
    Mutant("planner-cross-any-output", CORE + "compute/planner.py",
           "                if any(present) and (spec.name, (a, b), info.name) not in forced:",
           "                if all(present) and (spec.name, (a, b), info.name) not in forced:",
           tuple(CORE_TESTS), "the same rule for CROSS_MODEL kernels"),
    Mutant("planner-scope-not-a-pair", CORE + "compute/planner.py",
           "    if len(scope) == 2:\n        return", "    if len(scope) >= 2:\n        return",
           tuple(CORE_TESTS), "pairwise kernels need exactly two models"),
    # -- the runner -----------------------------------------------------------------------
    Mutant("runner-cross-args-both-a", CORE + "compute/inputs.py",
           "inputs[arg] = tuple(self._read(state, field, m, unit.param, lazy)",
           "inputs[arg] = tuple(self._read(state, field, unit.models[0], unit.param, lazy)",
           tuple(CORE_TESTS), "model b's data must reach the second slot"),
    Mutant("runner-drop-chunk-with-failure", CORE + "compute/runner.py",
           "        self.store.commit(batch)\n        report.notes.extend(batch.notes)",
           "        if not any(n.kind == 'failed' for n in batch.notes):\n"
           "            self.store.commit(batch)\n        report.notes.extend(batch.notes)",
           tuple(CORE_TESTS), "one failure must not cost the chunk's other results"),
    Mutant("runner-aggregate-does-not-wait", CORE + "compute/inputs.py",
           "                        self._check_not_blocked(state, field, model_id, names, have)\n",
           "", tuple(CORE_TESTS), "an aggregate over a partial set is never recomputed"),
    Mutant("runner-undefined-not-inherited", CORE + "compute/inputs.py",
           "                if note is not None and note.kind == \"undefined\":\n"
           "                    return f\"input {field!r} is undefined: {note.reason}\"",
           "                pass", tuple(CORE_TESTS), "undefined inputs make undefined outputs"),
    Mutant("runner-storable-not-checked", CORE + "compute/outcomes.py",
           "        problem = storable_problem(value)", "        problem = None",
           tuple(CORE_TESTS), "values no store can keep must fail their unit"),
    Mutant("stale-ignores-newer-inputs", CORE + "compute/staleness.py",
           "elif input_stamp.seq > stamp.seq:", "elif False:",
           ("tests/storage/test_provenance.py",), "a value older than its input is stale"),
    Mutant("stale-not-transitive", CORE + "compute/staleness.py",
           "                        if key in stale:", "                        if False:",
           ("tests/storage/test_provenance.py",), "staleness reaches what depends on it"),
    # -- the alignment pack -----------------------------------------------------------------
    Mutant("alignment-right-vectors-as-columns",
           "diffract_kernels_alignment/src/diffract_kernels_alignment/kernels.py",
           "    return va[:n].T, vb[:n].T", "    return va[:, :n], vb[:, :n]",
           ("tests/alignment",), "weights_rsvs holds V^T: right vectors are its rows"),
    Mutant("alignment-max-over-a",
           "diffract_kernels_alignment/src/diffract_kernels_alignment/kernels.py",
           "return np.max(np.abs(np.asarray(l_overlap)), axis=1)",
           "return np.max(np.abs(np.asarray(l_overlap)), axis=0)",
           ("tests/alignment",), "each direction of a gets its best match in b"),
    Mutant("alignment-weights-from-b",
           "diffract_kernels_alignment/src/diffract_kernels_alignment/kernels.py",
           "weights = np.asarray(svals[0], dtype=np.float64)[: len(values)]",
           "weights = np.asarray(svals[1], dtype=np.float64)[: len(values)]",
           ("tests/alignment",), "weighted means use model a's singular values"),
    Mutant("randomized-svd-no-power-iterations", SPECTRAL + "linalg.py",
           "POWER_ITERATIONS = 6", "POWER_ITERATIONS = 0",
           ("tests/spectral/test_kernels.py", "tests/alignment"),
           "the documented accuracy needs the power iterations"),
    # -- the local store -------------------------------------------------------------------
    Mutant("local-commit-not-atomic",
           "plugins/diffract_storage_local/src/diffract_storage_local/store.py",
           "                        (model_id, field, param, *enc, provs.get(field), seq))\n",
           "                        (model_id, field, param, *enc, provs.get(field), seq))\n"
           "                    db.execute('COMMIT'); db.execute('BEGIN IMMEDIATE')\n",
           ("tests/storage",), "a chunk's rows commit as one transaction"),
    Mutant("local-orphans-kept",
           "plugins/diffract_storage_local/src/diffract_storage_local/_directory.py",
           "                if rel not in referenced:",
           "                if False:",
           ("tests/storage",), "files of a chunk that never committed are cleaned up"),
    Mutant("esd-blas-threads-unpinned",
           SPECTRAL + "linalg.py",
           "    with one_blas_thread():\n        gram = _gram(",
           "    if True:\n        gram = _gram(",
           ("tests/spectral/test_same_bits.py",), "a spectrum's bits do not depend on the path"),
    Mutant("esd-default-float32",
           SPECTRAL + "kernels.py",
           '    precision: Literal["float32", "float64"] = "float64",\n    device: str = "auto",\n    conv:',
           '    precision: Literal["float32", "float64"] = "float32",\n    device: str = "auto",\n    conv:',
           ("tests/spectral/test_precision.py",), "the default spectrum is accurate to 1e-6"),
    # -- issue 26 item 4: areas where a deliberate bug went unnoticed ----------------------
    Mutant("stale-aggregates-single-model-only", CORE + "compute/staleness.py",
           "        if base == first and models and set(models) <= wanted:",
           "        if base == first and len(models) == 1 and set(models) <= wanted:",
           ("tests/core/test_stale_aggregates.py",), "cross-model aggregates go stale too"),
    Mutant("subspace-k-rounds-down",
           "diffract_kernels_alignment/src/diffract_kernels_alignment/kernels.py",
           "max(1, math.ceil(directions / 10))", "max(1, directions // 10)",
           ("tests/alignment/test_alignment.py",), "the default subspace size is ceil(k/10)"),
    Mutant("intruders-against-a-top-k-only",
           "diffract_kernels_alignment/src/diffract_kernels_alignment/kernels.py",
           "    best = np.max(np.abs(ua.T @ top), axis=0)",
           "    best = np.max(np.abs(ua[:, :top.shape[1]].T @ top), axis=0)",
           ("tests/alignment/test_alignment.py",), "intruders are new to all of a's directions"),
    Mutant("safetensors-half-block-offset",
           "plugins/diffract_formats/src/diffract_formats/_safetensors.py",
           "bits = self._read(name, np.dtype(np.uint16), offset + 2 * i, n, fh)",
           "bits = self._read(name, np.dtype(np.uint16), offset + i, n, fh)",
           ("tests/formats/test_hostile.py",), "half tensors over 4M elements read right"),
    Mutant("pvalue-fixed-unbiased-alpha", SPECTRAL + "significance.py",
           "        alpha = 1.0 + sizes / finite.sum(axis=1)",
           "        alpha = 1.0 + (sizes - 1) / finite.sum(axis=1)",
           ("tests/spectral/test_pvalue_fixed.py",), "the fixed-xmin replicates' MLE"),
    Mutant("esd-batch-drops-the-scale", SPECTRAL + "kernels.py",
           '    return [v if isinstance(v, BaseException) else _scaled(v, u["esd_scale"])',
           '    return [v if isinstance(v, BaseException) else v',
           ("tests/spectral/test_kernels.py",), "the batch path applies esd_scale"),
    Mutant("compare-exits-0-on-failures",
           "plugins/diffract_report/src/diffract_report/compare.py",
           "        if tell_failures(reports, tell):\n            return EXIT_FAILED",
           "        if tell_failures(reports, tell):\n            return EXIT_OK",
           ("tests/core/test_cli_analyze.py",), "compare exits 1 when a unit failed"),
    Mutant("esd-gram-not-blocked", SPECTRAL + "linalg.py",
           "    if a.dtype == dtype or short * long * dtype.itemsize <= GRAM_BLOCK_BYTES:",
           "    if True:",
           ("tests/spectral/test_precision.py",), "a large matrix is converted block by block"),
    Mutant("local-checksum-not-verified",
           "plugins/diffract_storage_local/src/diffract_storage_local/_codec.py",
           "    if found is not None and zlib.crc32(data) != int(found.group(1), 16):",
           "    if False:",
           ("tests/storage/test_local.py",), "every array file's CRC32 is checked on read"),
    Mutant("local-read-only-writes",
           "plugins/diffract_storage_local/src/diffract_storage_local/_directory.py",
           "    def check_writable(self) -> None:\n        if self.read_only:",
           "    def check_writable(self) -> None:\n        if False:",
           ("tests/storage/test_local.py",), "a read-only store refuses apply/add/erase"),
    Mutant("torch-reader-ignores-storage-offset",
           "plugins/diffract_formats/src/diffract_formats/torch_reader.py",
           "        base += meta.storage_offset() * item",
           "        base += 0",
           ("tests/formats/test_hostile.py",), "a torch tensor saved as a view of a storage"),
    Mutant("local-marker-dropped-at-write",
           "plugins/diffract_storage_local/src/diffract_storage_local/_directory.py",
           "        self._mark_writing()\n        name = uuid.uuid4().hex",
           "        name = uuid.uuid4().hex",
           ("tests/storage",), "a writer marks the store before writing array files"),
    Mutant("results-read-field-wrong-field",
           "diffract_core/src/diffract/results.py",
           "read = {f: store.read_field(m, stored[f]) for f in names}",
           "read = {f: store.read_field(m, stored[names[0]]) for f in names}",
           ("tests/core/test_track.py", "tests/storage"), "each field is read as itself"),
    Mutant("track-sudden-keeps-itself",
           "plugins/diffract_report/src/diffract_report/sudden.py",
           "others = np.delete(diffs, i)",
           "others = diffs",
           ("tests/core/test_track.py",), "a change is judged against the layer's other changes"),
    Mutant("onnx-gemm-transb-ignored",
           "plugins/diffract_formats/src/diffract_formats/onnx_reader.py",
           'return not attributes.get("transB", 0)', "return True",
           ("tests/formats",), "Gemm with transB=1 holds [out, in]: kept as stored"),
    Mutant("gguf-dims-not-reversed",
           "plugins/diffract_formats/src/diffract_formats/gguf_reader.py",
           "shape = tuple(int(d) for d in reversed(t.shape.tolist()))",
           "shape = tuple(int(d) for d in t.shape.tolist())",
           ("tests/formats",), "GGUF lists dimensions fastest first"),
    Mutant("flax-chunks-out-of-order",
           "plugins/diffract_formats/src/diffract_formats/flax_reader.py",
           "for k in sorted(chunks, key=int)]", "for k in sorted(chunks, reverse=True)]",
           ("tests/formats",), "a chunked array's chunks join in order"),
    Mutant("flax-chunks-text-order",
           "plugins/diffract_formats/src/diffract_formats/flax_reader.py",
           "for k in sorted(chunks, key=int)]", "for k in sorted(chunks)]",
           ("tests/formats/test_more_formats.py",),
           "chunks sorted as text: chunk 10 joins before chunk 2 (flax writes 16 here)"),
    Mutant("flax-shape-map-as-keys",
           "plugins/diffract_formats/src/diffract_formats/flax_reader.py",
           "value = [value[k] for k in sorted(value, key=int)]",
           "value = [int(k) for k in sorted(value, key=int)]",
           ("tests/formats/test_more_formats.py",),
           "the map flax writes for a chunked array's shape read by its keys (0, 1)"),
    # -- the Triton conv ------------------------------------------------------------------
    Mutant("conv-forward-tap", CONV,
           "+ w2 * _load_rows(xb, t - 1, d, d_ok, T, sxt, sxd)",
           "+ w2 * _load_rows(xb, t - 2, d, d_ok, T, sxt, sxd)",
           tuple(CONV_TESTS), "one tap of the forward reads the wrong time step"),
    Mutant("conv-backward-tap", CONV,
           "gx += w1 * _dz(w0 * xm1 + w1 * x0 + w2 * xp1 + w3 * xp2, g2)",
           "gx += w2 * _dz(w0 * xm1 + w1 * x0 + w2 * xp1 + w3 * xp2, g2)",
           tuple(CONV_TESTS), "dx takes each tap's weight"),
    # -- the Triton chunk_kda ---------------------------------------------------------------
    Mutant("kda-state-not-decayed", KDA, "S = S * g_c[:, None] + tl.dot",
           "S = S + tl.dot", tuple(KDA_TESTS), "the state skips the chunk's decay"),
    Mutant("kda-beta-through-inverse", KDA, "    d_b += tl.sum(d_m * tl.load(L + pa",
           "    d_b += 0 * tl.sum(d_m * tl.load(L + pa", tuple(KDA_TESTS),
           "dbeta misses its path through (I + diag(beta) L)^-1"),
    Mutant("kda-diagonal-block-as-column", KDA,
           "db += (rq[:, None] * q_c[None, :] + rl", "db += (0 * rq[:, None] * q_c[None, :] + rl",
           tuple(KDA_TESTS), "dk misses Aqk's diagonal sub-block"),
    Mutant("kda-last-k-block-dropped", KDA, "    for i_k in range(NK):",
           "    for i_k in range(NK - 1):", tuple(KDA_TESTS),
           "dX and dbeta lose one K-block's part"),
    Mutant("kda-gate-chunk-sum-exclusive", KDA,
           "    dy = tl.sum(x, 0)[None, :] - tl.cumsum(x, 0) + x",
           "    dy = tl.sum(x, 0)[None, :] - tl.cumsum(x, 0)", tuple(KDA_TESTS),
           "dg's reverse sum leaves out its own step"),
    Mutant("kda-inverse-block-term-dropped", KDA,
           "x30 = -_dot(x33, _dot(m30, x00) + _dot(m31, x10) + _dot(m32, x20))",
           "x30 = -_dot(x33, _dot(m30, x00) + _dot(m31, x10))", tuple(KDA_TESTS),
           "one term of the blockwise inverse's corner block"),
    Mutant("kda-lower-bound-dA", KDA, "            da = dy * slope * s\n",
           "            da = dy * slope\n", tuple(KDA_TESTS), "dA_log of the lower-bound gate"),
    Mutant("fitter-shared-peaks-outside-the-tail", SPECTRAL + "_search.py",
           "        j = np.clip(where(part, s), s, e - 1)",
           "        j = np.clip(where(part, s), 0, e - 1)",
           tuple(FITTER_TESTS), "the checks next to peaks read gaps below a candidate's xmin"),
    # -- issue 58: wrong steps, orders, means and identities in the last turns' code ----
    Mutant("monitor-views-without-config", TRAINING + "_setup.py",
           "            out.config = config\n", "            out.config = None\n",
           ("tests/training/test_monitor_views.py",),
           "the monitor's head views see no config (CodeGen's heads the wrong rows)"),
    Mutant("trajectory-ptype-mean-keeps-nan", "diffract_core/src/diffract/trajectory.py",
           "defined = [v for v in values if not math.isnan(v)]", "defined = list(values)",
           ("tests/core/test_track.py::TestTrajectory",), "one undefined parameter turns its type's mean NaN"),
    Mutant("schedule-block-cut-at-the-last-number", "diffract_kernels_spectral/src/"
           "diffract_kernels_spectral/schedule.py", r'_BLOCK = re.compile(r"^(.*?\.\d+)(?:\.|$)")',
           r'_BLOCK = re.compile(r"^(.*\.\d+)(?:\.|$)")', ("tests/spectral/test_estimators.py::TestSchedule",),
           "AlphaPruning by block makes each expert a block"),
    Mutant("steps-three-names-up", CORE + "steps.py",
           "*(p.name for p in path.parents)][:4]", "*(p.name for p in path.parents)][:3]",
           ("tests/core/test_steps.py",), "a step two folders above the weights' folder is lost"),
    Mutant("onnx-bf16-tensor-not-turned", FORMATS + "onnx_reader.py",
           "        bits = bits.T if self._turn[name] else bits\n", "",
           ("tests/formats/test_more_formats.py",),
           "an ONNX bfloat16 weight read through torch keeps ONNX's [in, out]"),
    Mutant("identity-without-ctime", FORMATS + "_common.py",
           "    return (stat.st_size, stat.st_mtime_ns, stat.st_ino, stat.st_ctime_ns)",
           "    return (stat.st_size, stat.st_mtime_ns, stat.st_ino)",
           ("tests/formats/test_dcp.py",),
           "a shard rewritten in place with its mtime restored is read as the old one"),
    Mutant("dcp-chunk-dtype-cast", FORMATS + "dcp_reader.py",
           "tuple(part.shape) != lengths \\\n                or part.dtype != dtype:",
           "tuple(part.shape) != lengths:", ("tests/formats/test_dcp.py",),
           "a chunk stored in another dtype than the metadata's is cast silently"),
    Mutant("monitor-summary-averages-views", TRAINING + "_analysis.py",
           "                    if param in parents:\n", "                    if True:\n",
           ("tests/training/test_monitor_numbers.py",), "head views averaged into a metric's whole-matrix mean"),
    Mutant("monitor-view-metrics-undefined-on-heads", TRAINING + "monitor.py",
           'VIEW_METRICS = ("pl_alpha_hill",', 'VIEW_METRICS = ("pl_alpha",',
           ("tests/training/test_monitor_numbers.py",), "the default per-head values silently disappear"),
    Mutant("monitor-resume-forgets-done-steps", TRAINING + "monitor.py",
           '                done.add(int(record["step"]))\n', "                pass\n",
           ("tests/training/test_monitor_numbers.py",), "a resumed run analyses again the steps in its store"),
    Mutant("hf-logs-at-the-finishing-step", TRAINING + "hf.py",
           "        at.global_step = step\n", "", ("tests/training/test_monitor_numbers.py",),
           "background values logged at the step the analysis finished"),
    Mutant("rank-local-before-global", TRAINING + "_snapshot.py",
           'for key in ("RANK", "LOCAL_RANK"):', 'for key in ("LOCAL_RANK", "RANK"):',
           ("tests/training/test_monitor_numbers.py",), "rank 0 of a second node writes the store"),
    Mutant("monitor-early-rank-keeps-writing", TRAINING + "monitor.py",
           "        if self.writer and rank() != 0:", "        if False:",
           ("tests/training/test_distributed.py",),
           "a monitor built before init_process_group logs on rank 1 too"),
    Mutant("json-depth-off-by-one", CORE + "sources.py", "depth > MAX_JSON_DEPTH) else None",
           "depth > MAX_JSON_DEPTH + 1) else None", ("tests/core/test_hostile_input.py",),
           "a side file one level deeper than the limit is read"),
    Mutant("json-depth-skips-lists", CORE + "sources.py",
           "(node.values() if isinstance(node, dict) else node)",
           "(node.values() if isinstance(node, dict) else ())", ("tests/core/test_hostile_input.py",),
           "lists nested 150 deep pass the depth check"),
    Mutant("deepspeed-padding-ignored", FORMATS + "deepspeed_reader.py",
           "                offset += numel + int(pad)\n", "                offset += numel\n",
           ("tests/formats/test_deepspeed.py",),
           "parameters after an alignment padding read shifted"),
    Mutant("views-patterns-anchored", "plugins/diffract_views/src/diffract_views/rules.py",
           "if name_pattern(given[kind]).search(name):", "if name_pattern(given[kind]).match(name):",
           ("tests/core/test_patterns.py",),
           "given name patterns must match from a name's start"),
    # torch.distributed (issue 72): who analyses what, what every rank gets, and when.
    Mutant("dist-one-rank-analyses-everything", TRAINING + "_dist.py",
           "        r = min(range(n), key=lambda i: (held[i], i))",
           "        r = 0", ("tests/training/test_distributed.py",),
           "rank 0 analyses every matrix while the others idle"),
    Mutant("dist-values-to-rank-0-only", TRAINING + "monitor.py",
           "            for hook in self._hooks:",
           "            for hook in self._hooks if self.writer else ():",
           ("tests/training/test_distributed_schedules.py::"
            "test_every_rank_steps_the_same_factors_as_one_process",),
           "the other ranks never get the alphas: their schedules keep 1x"),
    Mutant("dist-each-rank-maps-its-own-share", TRAINING + "_spread.py",
           "        for s in shares_:\n            table.update(s[\"table\"])",
           "        table.update(share.get(\"table\", {}))",
           ("tests/training/test_distributed_schedules.py::"
            "test_every_rank_steps_the_same_factors_as_one_process",),
           "a rank maps the alphas of its own share: the ranks' factors differ"),
    Mutant("dist-store-keeps-one-share", TRAINING + "_spread.py",
           "        for s in shares_:\n            batch.values.update(s[\"values\"])",
           "        for s in shares_[:1]:\n            batch.values.update(s[\"values\"])",
           ("tests/training/test_distributed.py",),
           "rank 0 stores its own share of a step and drops the others'"),
    Mutant("dist-failed-share-kept", TRAINING + "_spread.py",
           "        if errors:\n            for r, error in errors:",
           "        if False:\n            for r, error in errors:",
           ("tests/training/test_distributed_schedules.py::"
            "test_a_rank_whose_analysis_fails_holds_no_one_and_factors_stay",),
           "a step whose share failed on one rank is mapped and stored anyway"),
    Mutant("fsdp1-flat-names", TRAINING + "monitor.py",
           "            if self._fsdp1:  # FSDP1", "            if False:  # FSDP1",
           ("tests/training/test_distributed.py",),
           "FSDP1's flat parameters watched as ..._flat_param"),
    Mutant("names-live-not-saved", TRAINING + "monitor.py",
           '        self._renames = checkpoint_names(model) if hasattr(model, "named_parameters")'
           " else {}", "        self._renames = {}",
           ("tests/training/test_final_and_names.py",),
           "LLaVA's store names differ from its saved checkpoints'"),
    Mutant("split-load-keeps-old-groups", TRAINING + "_groups.py",
           "        if not where or len(groups) != len(where):", "        if True:",
           ("tests/training/test_schedules.py",),
           "optimizer.load_state_dict after attach: the schedule sets dicts no longer used"),
    Mutant("lightning-logs-at-the-finishing-step", TRAINING + "lightning.py",
           "logger.log_metrics(dict(values), step=step)",
           "logger.log_metrics(dict(values), step=self._trainer.global_step)",
           ("tests/training/test_monitor_numbers.py::"
            "test_lightning_logs_a_background_analysis_at_the_step_analysed",),
           "Lightning's background values logged at the step the analysis finished"),
    Mutant("monitor-due-forgets-done-steps", TRAINING + "monitor.py",
           "            and global_step not in self._done", "",
           ("tests/training/test_monitor.py::"
            "test_a_resumed_monitor_takes_none_of_the_steps_its_store_holds",),
           "a resumed run snapshots the steps its store holds (DuplicateModelError)"),
    Mutant("hf-resume-forgets-schedules", TRAINING + "hf.py",
           "        if self.schedules and state.global_step > 0:  # a resumed run",
           "        if False:", ("tests/training/test_schedules.py",),
           "a resumed Trainer run ramps its schedules again from 1x"),
    Mutant("lightning-resume-forgets-schedules", TRAINING + "lightning.py",
           "        if self.schedules and trainer.global_step > 0:  # resumed with ckpt_path",
           "        if False:", ("tests/training/test_schedules.py",),
           "a run resumed with ckpt_path ramps its schedules again from 1x"),
    Mutant("schedule-state-negative-factor", TRAINING + "schedules.py",
           "math.isfinite(value) and 0 <= value <= _MOST):\n                    problems.append"
           "(f\"{key!r}[",
           "math.isfinite(value) and -_MOST <= value <= _MOST):\n                    "
           "problems.append(f\"{key!r}[",
           ("tests/training/test_schedules.py",),
           "a loaded state's negative factor makes a negative rate: gradient ascent"),
    # Convolutions under the weightwatcher preset (issue 76.5).
    Mutant("ww-conv-evals-one-position", SPECTRAL + "kernels.py",
           "    return matrices * min(rows, cols)", "    return min(rows, cols)",
           ("tests/spectral/test_conv_weightwatcher.py",),
           "num_evals of a conv under the preset counts one kernel position"),
    Mutant("ww-conv-svals-unscaled", SPECTRAL + "kernels.py",
           "np.float64) * math.sqrt(0.5)", "np.float64) * 1.0",
           ("tests/spectral/test_conv_weightwatcher.py",),
           "a conv's singular values under the preset miss conv2d_norm's sqrt(1/2)"),
    Mutant("ww-conv-traps-replicas-per-position", SPECTRAL + "kernels_rmt.py",
           "matrices * min(rows, cols) < WW_FEW_EVALS", "min(rows, cols) < WW_FEW_EVALS",
           ("tests/spectral/test_conv_weightwatcher.py",),
           "a 3x3 conv's traps from 5 pooled shuffles (WeightWatcher counts all positions)"),
    # Parity with the schedules' authors (issue 76.3).
    Mutant("llr-top-over-balanced-only", TRAINING + "schedules.py",
           "        if top is not None and math.isfinite(top):",
           "        if False:", ("tests/training/test_schedules_authors.py",),
           "LayerwiseLR's range tops at the balanced modules' largest alpha (5.8% off)"),
    Mutant("llr-removed-head-still-pinned", TRAINING + "schedules.py",
           "        pinned = [n for n, _ in candidates if any(p in n for p in self._pinned)]",
           "        pinned = [n for n, _ in found if any(p in n for p in self._pinned)]",
           ("tests/training/test_schedules_authors.py",),
           "remove_first/remove_last leave the embedding and head at 5x, not 1x"),
    Mutant("ct-zero-points-packed-along-columns", FORMATS + "_compressed.py",
           "                z = dense(z.T, args.bits, rows).T.astype(np.float32)",
           "                z = dense(z, args.bits, rows).astype(np.float32)",
           ("tests/formats/test_quantized.py",),
           "compressed-tensors' packed zero points unpacked along the wrong axis"),
    Mutant("ct-dense-bits-high-first", FORMATS + "_compressed.py",
           'axis=1, bitorder="little")', 'axis=1, bitorder="big")',
           ("tests/formats/test_quantized.py",),
           "3-bit values that cross int32 words read with their bits reversed"),
    Mutant("ct-block-rows-by-columns", FORMATS + "_compressed.py",
           "    return grid[np.arange(rows) // r][:, np.arange(cols) // c]",
           "    return grid[np.arange(rows) // c % grid.shape[0]][:, np.arange(cols) // c]",
           ("tests/formats/test_quantized.py",), "a block scale's rows taken by its width"),
    # The wheels' checks (issue 71) and the Ray executor's (issue 73), issue 74.
    Mutant("wheel-dependency-forgotten", "plugins/diffract_report/pyproject.toml",
           '    "rich>=13",\n', "", ("tests/wheels/test_wheels.py::"
                                    "test_every_import_is_declared",),
           "diffractml-report installed alone fails at its first table (rich undeclared)"),
    Mutant("wheel-version-disagrees", "plugins/diffract_views/pyproject.toml",
           'version = "0.2.0"', 'version = "0.2.1"',
           ("tests/wheels/test_wheels.py::test_every_version_is_the_one_in_VERSION",),
           "one distribution released under another version than the rest"),
    Mutant("ray-port-without-upper-bound", "plugins/diffract_executor_ray/src/"
           "diffract_executor_ray/executor.py", "not 0 < int(port) < 65536", "not 0 < int(port)",
           ("tests/executors/test_ray.py::TestRay::"
            "test_bad_options_are_refused_when_the_session_opens",),
           "a port of 70000 taken, Ray then retrying it for minutes"),
    Mutant("ray-env-vars-unchecked", "plugins/diffract_executor_ray/src/"
           "diffract_executor_ray/executor.py",
           '            problems.append("runtime_env.env_vars must be a table of names to '
           'strings, got "',
           '            print("runtime_env.env_vars must be a table of names to strings, got "',
           ("tests/executors/test_ray.py::TestRay::"
            "test_bad_options_are_refused_when_the_session_opens",),
           "a runtime_env Ray refuses on the cluster, taken at the session's start"),
    Mutant("ray-remote-reads-this-machines-files", "plugins/diffract_executor_ray/src/"
           "diffract_executor_ray/executor.py", '    return True if _local(options) else "urls"',
           "    return True", ("tests/executors/test_ray.py::"
                              "test_what_the_workers_read_themselves",),
           "a remote cluster's workers sent this machine's paths, which they cannot open"),
    # Reliability, fifth pass (issue 73).
    Mutant("options-checked-at-the-top-only", FSSPEC + "objects.py",
           "                walk(value, f\"{path}.{key}\" if path else str(key))",
           "                walk(value, str(key)) if not path else None",
           ("tests/sources/test_objects.py",),
           "a credential one level down (client_kwargs.aws_secret_access_key) recorded"),
    Mutant("reads-not-verified-after", FSSPEC + "objects.py",
           "        if now != pinned:", "        if False:", ("tests/sources/test_objects.py",),
           "an object swapped between the identity and a tensor's GET mixed in"),
    Mutant("remote-deadline-never-set", FSSPEC + "objects.py",
           '            conf.setdefault("read_timeout", limit)', "            pass",
           ("tests/sources/test_objects.py::"
            "test_every_s3_request_gets_the_deadline_unless_the_user_set_one",),
           "a server that never answers holds the command for a minute a request"),
    Mutant("ue8m0-bias-off-by-one", FORMATS + "quantized.py",
           "bits.astype(np.int32) - 127", "bits.astype(np.int32) - 128",
           ("tests/formats/test_quantized.py",), "every UE8M0 scale halved"),
    Mutant("gptq-negative-group-wraps", FORMATS + "quantized.py",
           "_check(g.size == 0 or 0 <= int(g.min())", "_check(g.size == 0 or -9 <= int(g.min())",
           ("tests/formats/test_quantized.py",), "a negative g_idx reads the last group"),
    Mutant("stray-quantized-tensors-kept", FORMATS + "quantized.py",
           "    if stray:\n", "    if False:\n", ("tests/formats/test_quantized.py",),
           "a scale without its weight analysed raw as a parameter"),
    Mutant("selfcheck-cache-follows-links", "kernel_fun_gpu/src/kernel_fun/_check.py",
           "        if not stat.S_ISREG(info.st_mode):", "        if False:",
           ("tests/kernel_fun_gpu/test_self_check.py",),
           "a cache path that is a link (or /dev/null) written through"),
    Mutant("selfcheck-cache-part-not-exclusive", "kernel_fun_gpu/src/kernel_fun/_check.py",
           "    part = path.with_name(f\".{path.name}.{secrets.token_hex(8)}.part\")",
           "    part = path.with_name(f\".{path.name}.{os.getpid()}.part\")",
           ("tests/kernel_fun_gpu/test_self_check.py",),
           "a planted link at the predictable temporary name overwrites its target"),
    Mutant("rel-change-nan-as-zero", "diffract_kernels_alignment/src/"
           "diffract_kernels_alignment/kernels.py",
           "        if not np.isfinite(w).all():", "        if False:",
           ("tests/alignment/test_alignment.py",), "NaN weights said to be all zero"),
    Mutant("monitor-model-level-filtered", TRAINING + "_analysis.py",
           "                reports.append(scoped.compute.apply(  # refused); views are not"
           " counted",
           "                reports.append(scoped.filter(param_names=names).compute.apply(",
           ("tests/training/test_monitor.py",),
           "per-model fields of a monitor never computed"),
]


def _copy_tree(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, target)


def run(mutant: Mutant, scratch: Path) -> tuple[str, float]:
    """'killed', 'SURVIVED' or 'BROKEN' (the change does not apply), and seconds."""
    target = scratch / mutant.path
    original = target.read_text()
    if original.count(mutant.old) != 1:
        return "BROKEN", 0.0
    target.write_text(original.replace(mutant.old, mutant.new))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(str(scratch / s) for s in SOURCES)
    env.setdefault("PYTHONDONTWRITEBYTECODE", "1")
    start = time.perf_counter()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider",
             "-p", "no:randomly", *mutant.tests],
            cwd=scratch, env=env, capture_output=True, text=True,
        )
    finally:
        target.write_text(original)
    return ("SURVIVED" if done.returncode == 0 else "killed"), time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("prefix", nargs="*", help="run only mutants whose name starts so")
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    args = parser.parse_args()
    chosen = [m for m in MUTANTS if not args.prefix or m.name.startswith(tuple(args.prefix))]
    if args.list:
        for m in chosen:
            print(f"{m.name:34s} {m.why}")
        return 0
    with tempfile.TemporaryDirectory(prefix="diffract-mutants-") as tmp:
        scratch = Path(tmp)
        _copy_tree(scratch)
        check = subprocess.run([sys.executable, "-c", "import diffract; print(diffract.__file__)"],
                               cwd=scratch, capture_output=True, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                   str(scratch / s) for s in SOURCES)})
        if not check.stdout.startswith(str(scratch)):
            print(f"mutate: the scratch copy does not shadow the installed sources: {check.stdout}"
                  f"{check.stderr}", file=sys.stderr)
            return 2
        results = []
        for m in chosen:
            outcome, seconds = run(m, scratch)
            results.append((m, outcome))
            print(f"{outcome:8s} {seconds:6.1f}s  {m.name:34s} {m.why}", flush=True)
    survivors = [m for m, outcome in results if outcome != "killed"]
    print(f"\n{len(results) - len(survivors)} of {len(results)} mutants killed"
          + (f"; not killed: {', '.join(m.name for m in survivors)}" if survivors else ""))
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
