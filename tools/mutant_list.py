"""The mutants of tools/mutants.py: plausible bugs, each a single exact edit.

Each entry: ``name``; ``path`` (from the repository root); ``old``, a snippet
that occurs exactly once in that file; ``new``, what it becomes; ``tests``,
the pytest node ids (or files) meant to catch it; ``what``, the bug in a few
words. ``requires`` (optional): an instruction set the CPU must have for the
planted code to run at all (the campaign skips the mutant elsewhere).
"""

MUTANTS = [
    # ------------------------------------------------------------------
    # C++ kernels (csrc/)
    # ------------------------------------------------------------------
    {
        "name": "cpp-per-tensor-keeps-last-piece",
        "path": "csrc/kernels.cpp",
        "old": "      merge(tensors[size_t(split.piece(i).tensor)], pieces[size_t(i)], mode, p);",
        "new": "      tensors[size_t(split.piece(i).tensor)] = pieces[size_t(i)];",
        "tests": ["tests/test_norm.py::test_tensor_norms"],
        "what": "a tensor's own norm keeps only its last piece (a tensor over one 256 KiB task)",
    },
    {
        "name": "cpp-merge-grouped-by-thread",
        "path": "csrc/kernels.cpp",
        "old": (
            "  if (failed != nullptr && failed->load(std::memory_order_acquire)) return;\n\n"
            "  Partial total;\n  for (const Partial& acc : partial) merge(total, acc, mode, p);\n"
        ),
        "new": (
            "  if (failed != nullptr && failed->load(std::memory_order_acquire)) return;\n\n"
            "  Partial total;\n"
            "  const int64_t threads = threads_for(split, num_threads);\n"
            "  for (int64_t t = 0; t < threads; ++t) {\n"
            "    Partial own;\n"
            "    for (int64_t task = t; task < split.num_tasks(); task += threads) {\n"
            "      merge(own, partial[size_t(task)], mode, p);\n"
            "    }\n"
            "    merge(total, own, mode, p);\n"
            "  }\n"
        ),
        "tests": ["tests/test_norm.py::test_cpp_result_does_not_depend_on_thread_count"],
        "what": "task partials summed per thread first: the grouping depends on the thread count",
    },
    {
        "name": "cpp-clip-float32-drops-eps",
        "path": "csrc/kernels.cpp",
        "old": "    coef = (1.0f / (norm + float(1e-6))) * float(max_norm);",
        "new": "    coef = (1.0f / norm) * float(max_norm);",
        "tests": ["tests/test_clip.py::test_bitwise_equal_to_torch_given_the_same_norm"],
        "what": "the clip coefficient of a float32 norm without torch's + 1e-6",
    },
    {
        "name": "cpp-clip-float64-drops-eps",
        "path": "csrc/kernels.cpp",
        "old": "    coef64 = (1.0 / (norm + 1e-6)) * max_norm;",
        "new": "    coef64 = (1.0 / norm) * max_norm;",
        "tests": ["tests/test_clip.py::test_bitwise_equal_to_torch_given_the_same_norm"],
        "what": "the clip coefficient of a float64 norm without torch's + 1e-6",
    },
    {
        "name": "cpp-scale-writes-without-clipping",
        "path": "csrc/kernels.cpp",
        "old": "  if (coef64 >= 1.0) return false;",
        "new": "  if (coef64 >= 1.0) {\n    coef = 1.0f;\n    coef64 = 1.0;\n  }",
        "tests": ["tests/test_clip.py::test_no_clip_touches_no_memory"],
        "what": "a clip that does not clip still rewrites every gradient (by 1.0)",
    },
    {
        "name": "cpp-linf-merge-drops-nan",
        "path": "csrc/fastnorm.h",
        "old": "{ return (b > a || b != b) ? b : a; }",
        "new": "{ return b > a ? b : a; }",
        "tests": ["tests/test_norm.py::test_nan_and_inf_propagate"],
        "what": "the max of two pieces drops a NaN (p=inf)",
    },
    {
        "name": "cpp-portable-fold-order",
        "path": "csrc/lanes.h",
        "old": "  return (j[0] + j[2]) + (j[1] + j[3]);",
        "new": "  return (j[0] + j[1]) + (j[2] + j[3]);",
        "tests": [
            "tests/test_cpu_kernels.py::test_every_instruction_set_gives_the_same_bits",
            "tests/test_cpu_kernels.py::test_sums_follow_the_documented_lane_order",
        ],
        "what": "the portable loops fold their lanes in another order than the vector ones",
    },
    {
        "name": "cpp-avx512-fold-order",
        "path": "csrc/isa_avx512.h",
        "old": (
            "  const __m512d h01 = _mm512_add_pd(a.z[0], a.z[2]);  // (H0 | H1)\n"
            "  const __m512d h23 = _mm512_add_pd(a.z[1], a.z[3]);  // (H2 | H3)\n"
        ),
        "new": (
            "  const __m512d h01 = _mm512_add_pd(a.z[0], a.z[1]);\n"
            "  const __m512d h23 = _mm512_add_pd(a.z[2], a.z[3]);\n"
        ),
        "tests": ["tests/test_cpu_kernels.py::test_every_instruction_set_gives_the_same_bits"],
        "what": "the AVX-512 fold pairs the wrong lane groups (same sum, other rounding)",
        "requires": "avx512",
    },
    {
        "name": "cpp-avx2-tail-drops-last",
        "path": "csrc/isa_avx2.h",
        "old": (
            "  alignas(32) typename E::T padded[kLanes] = {};\n"
            "  std::memcpy(padded, x, size_t(n) * sizeof(typename E::T));"
        ),
        "new": (
            "  alignas(32) typename E::T padded[kLanes] = {};\n"
            "  std::memcpy(padded, x, size_t(n - 1) * sizeof(typename E::T));"
        ),
        "tests": ["tests/test_norm.py::test_matches_oracle"],
        "what": "the AVX2 loop's last partial block misses its last element",
        "requires": "avx2",
    },
    {
        "name": "cpp-piece-offset-in-elements",
        "path": "csrc/kernels.cpp",
        "old": "pieces_.push_back({addrs[i] + uintptr_t(done * size), take",
        "new": "pieces_.push_back({addrs[i] + uintptr_t(done), take",
        "tests": ["tests/test_norm.py::test_matches_oracle"],
        "what": "a tensor's second task starts at an offset counted in elements, not bytes",
    },
    {
        "name": "cpp-stats-bf16-block-0-not-counted",
        "path": "csrc/isa_avx2.h",
        "old": "visit(x + counted, b * kLanes - counted);",
        "new": "if (b > 1) visit(x + counted, b * kLanes - counted);",
        "tests": ["tests/test_stats.py::test_cpp_counts_see_every_stretch_of_the_fused_pass_once"],
        "what": "the bfloat16 word loop's first block, summed before the chunks, never reaches the counts",
    },
    {
        "name": "cpp-stats-bf16-last-chunk-not-counted",
        "path": "csrc/isa_avx2.h",
        "old": "if (counted < n) visit(x + counted, n - counted);",
        "new": "if (counted < n) visit(x + counted, n % kLanes);",
        "tests": ["tests/test_stats.py::test_cpp_counts_see_every_stretch_of_the_fused_pass_once"],
        "what": "after the bfloat16 word loop only the tail is counted, not the last chunk",
    },
    {
        "name": "cpp-stats-stretch-end-not-counted",
        "path": "csrc/kernels_impl.h",
        "old": "visit.stretch(x + c, end - c);",
        "new": "visit.stretch(x + c, end - c - kLanes);",
        "tests": ["tests/test_stats.py::test_cpp_counts_see_every_stretch_of_the_fused_pass_once"],
        "what": "the last block of every stretch of the fused pass escapes the counts",
    },
    {
        "name": "cpp-stats-tail-not-counted",
        "path": "csrc/kernels_impl.h",
        "old": "      visit(x + i, n - i);\n",
        "new": "",
        "tests": ["tests/test_stats.py::test_cpp_counts_see_every_stretch_of_the_fused_pass_once"],
        "what": "a piece's last, partial block is summed but not counted",
    },
    {
        "name": "bench-progress-stream-bound-at-import",
        "path": "fastnorm/bench/cli.py",
        "old": "stream: TextIO | None = None,",
        "new": "stream: TextIO | None = sys.stderr,",
        "tests": ["tests/test_bench.py::test_progress_writes_to_the_stderr_of_the_moment_not_of_the_import"],
        "what": "the progress line writes to the stderr of the import, which a capture may have closed",
    },
    {
        "name": "cpp-stats-bounds-lanes-ignored",
        "path": "csrc/kernels_impl.h",
        "old": "if (!low && bottom >= S(lo)) return;",
        "new": "if (bottom >= S(lo)) return;",
        "tests": ["tests/test_stats.py::test_cpp_counts_see_every_stretch_of_the_fused_pass_once"],
        "what": "a stretch whose zero or subnormal is in the vector lanes of the bounds' loop is not counted",
    },
    {
        "name": "cpp-stats-bounds-max-dropped",
        "path": "csrc/kernels_impl.h",
        "old": "    m = std::max(m, bounds.top());\n",
        "new": "",
        "tests": ["tests/test_stats.py::test_cpp_counts_see_every_stretch_of_the_fused_pass_once"],
        "what": "the largest magnitude kept in the bounds' lanes never reaches the statistics",
    },
    {
        "name": "cpp-avx512-stretch-never-low",
        "path": "csrc/isa_avx512.h",
        "old": "const bool low = L::less(least, L::set1(lo)) != 0;",
        "new": "const bool low = false;",
        "tests": ["tests/test_stats.py::test_cpp_counts_see_every_stretch_of_the_fused_pass_once"],
        "what": "the AVX-512 block bounds never send a stretch with zeros or subnormals to the counts",
    },
    {
        "name": "cpp-avx2-counts-miss-second-register-zeros",
        "path": "csrc/isa_avx2.h",
        "old": "    z1 = L::sub(z1, L::eq(a1, none));\n",
        "new": "",
        "tests": ["tests/test_stats.py::test_cpp_counts_see_every_stretch_of_the_fused_pass_once"],
        "what": "the AVX2 counts' loop counts the zeros of one register of each pair only",
        "requires": "avx2",
    },
    {
        "name": "cpp-avx2-counts-max-of-first-register-only",
        "path": "csrc/isa_avx2.h",
        "old": "    m1 = L::max(m1, a1);\n    z0 = L::sub(z0, L::eq(a0, none));",
        "new": "    z0 = L::sub(z0, L::eq(a0, none));",
        "tests": ["tests/test_stats.py::test_cpp_counts_alone_find_the_largest_magnitude_in_every_lane"],
        "what": "the AVX2 counts' loop takes the largest magnitude of one register of each pair only",
        "requires": "avx2",
    },
    {
        "name": "cpp-avx2-bf16-visitor-through-the-reference",
        "path": "csrc/isa_avx2.h",
        "old": "  std::decay_t<Visit> visit = caller;\n",
        "new": "  Visit& visit = caller;\n",
        "tests": ["tests/test_cpu_codegen.py::test_the_statistics_loops_keep_their_lanes_in_registers"],
        "what": "the bfloat16 word loop reaches its visitor through the reference: the bounds' lanes live in memory",
    },
    {
        "name": "cpp-prefetch-none-on-amd-without-avx512",
        "path": "csrc/kernels.cpp",
        "old": "  if (vendor == \"amd\" && !avx512) return 1024;\n",
        "new": "",
        "tests": ["tests/test_cpu_kernels.py::test_the_default_prefetch_distance_follows_the_vendor"],
        "what": "AMD CPUs without AVX-512 (Zen 3) get no software prefetch",
    },
    {
        "name": "diagnosis-a-return-to-chance-under-a-rising-rate-checks-the-labels",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "    if stall.learned() and ev.warmup_until is not None and ev.warmup_until >= stall.start:\n",
        "new": "    if False:\n",
        "tests": [
            "tests/test_diagnosis.py::"
            "test_a_loss_that_learned_then_went_back_to_chance_as_the_rate_still_rose_lowers_the_rate"
        ],
        "what": "a loss that learned below chance, then returned to it as the rate rose, blames the labels",
    },
    {
        "name": "diagnosis-a-loss-rising-for-many-steps-into-inf-is-no-blow-up",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "            if not (best_early and values[-1] == max(values)):\n",
        "new": "            if True:\n",
        "tests": [
            "tests/test_diagnosis.py::"
            "test_a_loss_that_rose_for_many_steps_straight_into_inf_diverged_from_the_start"
        ],
        "what": "a loss that rose from its first points into inf over many steps leads with a re-run",
    },
    {
        "name": "diagnosis-zeros-after-a-collapse-lead",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "            if collapse is not None and collapse.start_step <= zero.start_step:\n",
        "new": "            if False:\n",
        "tests": [
            "tests/test_diagnosis.py::"
            "test_zeros_after_the_loss_went_non_finite_are_its_aftermath_not_the_finding_that_leads"
        ],
        "what": "exact zeros after a non-finite loss are read as nothing training and lead",
    },
    {
        "name": "diagnosis-a-norm-never-finite-is-a-rerun",
        "path": "fastnorm/monitoring/diagnosis/skips.py",
        "old": "                    if r.start == first:  "
        "# not one finite norm: no update was ever applied\n",
        "new": "                    if False:\n",
        "tests": [
            "tests/test_diagnosis.py::"
            "test_a_norm_never_finite_under_a_finite_loss_leads_with_the_precision_not_a_rerun"
        ],
        "what": "a norm inf at every step under a finite loss leads with a re-run from a checkpoint",
    },
    {
        "name": "diagnosis-a-plateau-at-a-cut-is-dated-from-the-first-step",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        start = change[0] if change is not None else self._first_step\n",
        "new": "        start = self._first_step\n",
        "tests": [
            "tests/test_diagnosis.py::test_a_plateau_at_a_logged_cut_of_the_rate_is_dated_from_the_cut"
        ],
        "what": "a plateau where the logged rate was cut is dated from the run's first step, not the cut",
    },
    {
        "name": "stats-total-from-torch-rows",
        "path": "fastnorm/_eager.py",
        "old": "        total = _reduce(norm_plan, p, \"tensor_stats\")[0]\n",
        "new": "        total = _total(plan, results, mode, p, dtype)\n",
        "tests": [
            "tests/test_stats.py::test_the_total_is_total_norms_bits_with_or_without_the_backends_statistics"
        ],
        "what": "on a backend without statistics the total is torch's sum, not total_norm's bits",
    },
    {
        "name": "cpp-prefetch-loop-runs-past-the-piece",
        "path": "csrc/prefetch.h",
        "old": "return ahead > 0 ? n - ahead / int64_t(sizeof(T)) : 0;",
        "new": "return ahead > 0 ? n + ahead / int64_t(sizeof(T)) : 0;",
        "tests": ["tests/test_cpu_kernels.py::test_the_prefetch_distance_never_changes_the_bits"],
        "what": "the prefetching loop's last blocks read past the piece's end",
    },
    {
        "name": "prefetch-setting-not-whole-lines",
        "path": "fastnorm/_extension.py",
        "old": " and int(value) % 64 == 0:",
        "new": ":",
        "tests": ["tests/test_cpu_kernels.py::test_a_prefetch_distance_out_of_range_is_refused"],
        "what": "FASTNORM_PREFETCH=100 passes Python's check and fails the extension's import instead",
    },
    {
        "name": "cpp-16bit-inf-unchecked",
        "path": "csrc/kernels_impl.h",
        "old": "  if constexpr (sizeof(typename E::T) == 2) {\n    // s != s",
        "new": "  if constexpr (sizeof(typename E::T) == 1) {\n    // s != s",
        "tests": ["tests/test_cpu_kernels.py::test_bf16_words_keep_inf_and_nan"],
        "what": "16-bit sums that are NaN or inf are never checked: bfloat16 words turn inf into NaN",
        "requires": "avx2",
    },
    {
        "name": "cpp-16bit-check-misses-nan",
        "path": "csrc/kernels_impl.h",
        "old": "    if (s != s || s >= (Power == 2",
        "new": "    if (s >= (Power == 2",
        "tests": ["tests/test_cpu_kernels.py::test_bf16_words_keep_inf_and_nan"],
        "what": "a NaN sum skips the check against the largest magnitude: the NaN of an inf's word stands",
        "requires": "avx2",
    },
    {
        "name": "cpp-bf16-words-unchecked",
        "path": "csrc/isa_avx2.h",
        "old": "        if (!(_mm_getcsr() & kDenormalFlag)) continue;",
        "new": "        continue;",
        "tests": ["tests/test_cpu_kernels.py::test_bf16_words_give_the_exact_lane_sums"],
        "what": "a chunk read as words is kept though a zero's word was a subnormal",
        "requires": "avx2",
    },
    {
        "name": "cpp-bf16-daz-keeps-subnormals-out",
        "path": "csrc/isa_avx2.h",
        "old": "      if (!any_below(least, 0x7F)) continue;",
        "new": "      continue;",
        "tests": ["tests/test_cpu_kernels.py::test_bf16_words_give_the_exact_lane_sums"],
        "what": "with denormals-are-zero, a subnormal element counts as zero",
        "requires": "avx2",
    },
    {
        "name": "cpp-bf16-first-block-as-words",
        "path": "csrc/isa_avx2.h",
        "old": "    add_block<BF16, Power>(acc, x);\n    if constexpr (kVisitsBlocks<Visit>)",
        "new": "    add_bf16_words<Power>(acc, x);\n    if constexpr (kVisitsBlocks<Visit>)",
        "tests": ["tests/test_cpu_kernels.py::test_bf16_words_read_nothing_outside_the_tensor"],
        "what": "the first block is read as words too, one element before the tensor",
        "requires": "avx2",
    },
    {
        "name": "cpp-bf16-words-exceptions-unmasked",
        "path": "csrc/isa_avx2.h",
        "old": "    const unsigned clear = (entry & ~kDenormalFlag) | kExceptionMasks;",
        "new": "    const unsigned clear = entry & ~kDenormalFlag;",
        "tests": ["tests/test_cpu_kernels.py::test_bf16_words_raise_no_exception_of_their_own"],
        "what": "the word loop's own signalling NaNs trap where the caller unmasked the invalid exception",
        "requires": "avx2",
    },
    {
        "name": "cpp-bf16-flags-left-raised",
        "path": "csrc/isa_avx2.h",
        "old": "    if (_mm_getcsr() != entry) _mm_setcsr(entry);",
        "new": "    _mm_setcsr(_mm_getcsr() & ~kDenormalFlag);",
        "tests": ["tests/test_cpu_kernels.py::test_bf16_words_raise_no_exception_of_their_own"],
        "what": "the invalid flag the word loop raised stays raised for the caller",
        "requires": "avx2",
    },
    {
        "name": "cpp-bf16-ignores-callers-flush-mode",
        "path": "csrc/isa_avx2.h",
        "old": "    const unsigned clear = (entry & ~kDenormalFlag) | kExceptionMasks;",
        "new": "    const unsigned clear = (entry & ~(kDenormalFlag | kDenormalsAreZero)) | kExceptionMasks;",
        "tests": [
            "tests/test_cpu_kernels.py::test_bf16_under_the_callers_flush_denormal_mode_every_instruction_set_agrees"
        ],
        "what": "under the caller's flush-denormal mode the word loop keeps subnormals the other loops flush",
        "requires": "avx2",
    },
    {
        "name": "cpp-bf16-mxcsr-not-restored",
        "path": "csrc/isa_avx2.h",
        "old": "    if (_mm_getcsr() != entry) _mm_setcsr(entry);",
        "new": "    _mm_setcsr(_mm_getcsr() & ~kDenormalsAreZero);",
        "tests": ["tests/test_cpu_kernels.py::test_bf16_words_leave_the_callers_denormal_mode_as_it_was"],
        "what": "the caller's denormals-are-zero mode is left off after the word loop",
        "requires": "avx2",
    },
    {
        "name": "cpp-l2-rescale-shift-sign",
        "path": "csrc/kernels.cpp",
        "old": "2 * (std::ilogb(small.m > 0.0 ? small.m : 1.0) - std::ilogb(big.m > 0.0 ? big.m : 1.0));",
        "new": "2 * (std::ilogb(big.m > 0.0 ? big.m : 1.0) - std::ilogb(small.m > 0.0 ? small.m : 1.0));",
        "tests": ["tests/test_cpu_kernels.py::test_float64_l2_merges"],
        "what": "merging scaled L2 partials moves the smaller one up instead of down",
    },
    {
        "name": "cpp-l2-underflow-unscaled",
        "path": "csrc/fastnorm.h",
        "old": "return s >= 0x1p-969 && s <= 0x1.fffffffffffffp+1023;",
        "new": "return s >= 0.0 && s <= 0x1.fffffffffffffp+1023;",
        "tests": ["tests/test_cpu_kernels.py::test_float64_l2_is_accurate_at_every_magnitude"],
        "what": "float64 squares that underflow are summed plain (subnormal gradients lose their norm)",
    },
    {
        "name": "cpp-cached-clip-writes-inference-tensors",
        "path": "csrc/snapshot.cpp",
        "old": "      ok = writable(tensor) && PyList_Append(out, tensor) == 0 &&",
        "new": "      ok = PyList_Append(out, tensor) == 0 &&",
        "tests": ["tests/test_clip.py::test_an_inference_tensor_at_a_cached_gradients_address_is_refused"],
        "what": "a cached clip_ plan writes an inference tensor that took a gradient's place",
    },
    {
        "name": "cpp-bf16-rounds-ties-up",
        "path": "csrc/convert.h",
        "old": "  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;",
        "new": "  const uint32_t rounded = (u + 0x8000u) >> 16;",
        "tests": [
            "tests/test_cpu_kernels.py::test_every_instruction_set_scales_every_16bit_value_like_torch",
        ],
        "what": "the portable bfloat16 rounding breaks ties upwards, not to even like torch",
    },
    {
        "name": "cpp-cache-ignores-dtype",
        "path": "csrc/snapshot.cpp",
        "old": "  if (dtype != f.dtype.ptr()) return false;",
        "new": "  (void)f;",
        "tests": [
            "tests/test_plan_cache.py::test_a_gradient_changed_in_place_rebuilds_the_plan",
            "tests/test_backends.py::test_cache_notices_a_new_dtype_at_the_same_address",
        ],
        "what": "the plan cache misses a new dtype at the same address",
    },
    {
        "name": "cpp-cache-ignores-strides",
        "path": "csrc/snapshot.cpp",
        "old": "    if (equal != 1) return false;",
        "new": "    (void)equal;",
        "tests": ["tests/test_plan_cache.py::test_channels_last_gradients_keep_their_strides"],
        "what": "the plan cache misses new strides of a dense, non-contiguous gradient",
    },
    {
        "name": "cpp-cache-ignores-item-type",
        "path": "csrc/snapshot.cpp",
        "old": "    if (reinterpret_cast<PyObject*>(Py_TYPE(item)) != item_type_.ptr()) return false;",
        "new": "",
        "tests": ["tests/test_plan_cache.py::test_an_item_of_another_type_at_the_same_address_rebuilds"],
        "what": "the plan cache serves an object of another type at a cached item's address",
    },
    {
        "name": "cpp-cache-ignores-dtensor-placements",
        "path": "csrc/snapshot.cpp",
        "old": "ok = same_spec(dtensor != nullptr ? dtensor : item, facts);",
        "new": "ok = true;",
        "tests": ["tests/test_distributed.py::test_cached_plan_follows_dtensor_layouts"],
        "what": "a cached plan serves a DTensor gradient with other placements (Partial sums read as shards)",
    },
    {
        "name": "cpp-cache-compares-dtensor-specs-by-identity",
        "path": "csrc/snapshot.cpp",
        "old": "  bool same = spec == f.spec.ptr();\n  if (!same) {",
        "new": "  bool same = spec == f.spec.ptr();\n  if (false) {",
        "tests": ["tests/test_distributed.py::test_cached_plan_follows_dtensor_layouts"],
        "what": "every new DTensor gradient spec rebuilds the plan, even with the same layout",
    },
    {
        "name": "cpp-checked-reduce-reads-after-a-failed-check",
        "path": "csrc/kernels.cpp",
        "old": "    return progress.load(std::memory_order_acquire) >= gate;\n",
        "new": "    return true;\n",
        "tests": ["tests/test_plan_cache.py::test_a_gradient_that_moved_is_never_read_at_its_old_address"],
        "what": "once the check fails, the waiting tasks read the stale addresses anyway",
    },
    {
        "name": "cpp-checked-reduce-gate-one-item-early",
        "path": "csrc/kernels.cpp",
        "old": "[size_t(task_start_[size_t(task) + 1] - 1)].tensor)] + 1;",
        "new": "[size_t(task_start_[size_t(task) + 1] - 1)].tensor)];",
        "tests": ["tests/test_plan_cache.py::test_a_gradient_that_moved_is_never_read_at_its_old_address"],
        "what": "a task reads its tensor before the item that gives it is checked",
    },
    {
        "name": "cpp-checked-reduce-ignores-the-check",
        "path": "csrc/kernels.cpp",
        "old": "    if (!check(progress)) failed.store(true, std::memory_order_release);",
        "new": "    check(progress);\n    progress.store(INT64_MAX);",
        "tests": ["tests/test_plan_cache.py::test_a_gradient_that_moved_is_never_read_at_its_old_address"],
        "what": "the reduction read while checking is kept though the check failed",
    },
    {
        "name": "cpp-checked-gradients-not-held",
        "path": "csrc/snapshot.cpp",
        "old": "    if (ok && tensor != nullptr && keep != nullptr) ok = PyList_Append(keep, tensor) == 0;\n",
        "new": "",
        "tests": ["tests/test_plan_cache.py::test_a_gradient_dropped_during_the_check_is_read_as_it_was"],
        "what": "a gradient checked is not kept: Python code in the check drops it, the kernel reads it",
    },
    {
        "name": "cpp-check-clears-every-exception",
        "path": "csrc/snapshot.cpp",
        "old": (
            "  if (PyErr_Occurred() != nullptr &&\n"
            "      (PyErr_ExceptionMatches(PyExc_TypeError) || "
            "PyErr_ExceptionMatches(PyExc_AttributeError) ||\n"
            "       PyErr_ExceptionMatches(PyExc_RuntimeError))) {"
        ),
        "new": "  if (PyErr_Occurred() != nullptr) {",
        "tests": [
            "tests/test_plan_cache.py::test_an_exception_raised_during_the_check_propagates_with_nothing_written"
        ],
        "what": "a KeyboardInterrupt raised in the cached plan's check is cleared, the call returns normally",
    },
    {
        "name": "cpp-gates-from-a-tasks-first-gradient",
        "path": "csrc/kernels.cpp",
        "old": "[size_t(task_start_[size_t(task) + 1] - 1)].tensor)] + 1;",
        "new": "[size_t(task_start_[size_t(task)])].tensor)] + 1;",
        "tests": [
            "tests/test_plan_cache.py::test_a_moved_gradient_that_shares_its_task_is_never_read_at_its_old_address"
        ],
        "what": "a task holding several gradients waits for its first only and reads the others unchecked",
    },
    {
        "name": "cpp-helpers-keep-their-own-float-modes",
        "path": "csrc/thread_pool.h",
        "old": "      const FloatModes::Scope scope(job->modes);  // a no-op on the caller\n",
        "new": "",
        "tests": ["tests/test_cpu_kernels.py::test_the_callers_floating_point_modes_rule_every_thread"],
        "what": "torch's OpenMP threads read subnormals the caller flushes: the norm depends on the thread",
    },
    {
        "name": "cpp-own-pool-keeps-its-own-float-modes",
        "path": "csrc/thread_pool.h",
        "old": "        const FloatModes::Scope scope(modes_);\n",
        "new": "",
        "tests": ["tests/test_cpu_kernels.py::test_the_callers_floating_point_modes_rule_every_thread"],
        "what": "the own pool's threads read subnormals the caller flushes: the norm depends on the thread",
    },
    {
        "name": "cpp-helpers-round-to-nearest-always",
        "path": "csrc/thread_pool.h",
        "old": "  static constexpr unsigned kModes = 0x8000u | 0x6000u | 0x0040u;",
        "new": "  static constexpr unsigned kModes = 0x8000u | 0x0040u;",
        "tests": ["tests/test_cpu_kernels.py::test_the_callers_floating_point_modes_rule_every_thread"],
        "what": "the helpers keep their own rounding mode: under fesetround the bits depend on the thread",
    },
    {
        "name": "cpp-16bit-counts-wrap",
        "path": "csrc/kernels_impl.h",
        "old": "constexpr int64_t kCountBlock = 32768;",
        "new": "constexpr int64_t kCountBlock = 1 << 20;",
        "tests": ["tests/test_stats.py::test_cpp_counts_of_a_16_bit_piece_over_65535_values_are_exact"],
        "what": "the counts of 16-bit values are summed once per piece: past 65535 they wrap",
    },
    {
        "name": "cpp-avx512-bf16-widened-as-the-low-half",
        "path": "csrc/isa_avx512.h",
        "old": "    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));",
        "new": "    return _mm256_castsi256_ps(_mm256_cvtepu16_epi32(h));",
        "tests": ["tests/test_stats.py::test_cpp_statistics_keep_the_norms_bits_in_every_mode"],
        "what": "the statistics' pass widens bfloat16 into a float32's low half: its sum is not the norm's",
        "requires": "avx512",
    },
    {
        "name": "cpp-avx512-counts-drop-the-second-register",
        "path": "csrc/isa_avx512.h",
        "old": "  _mm512_store_si512(zs, L::add(z0, z1));",
        "new": "  _mm512_store_si512(zs, z0);",
        "tests": [
            "tests/test_stats.py::test_cpp_statistics_do_not_depend_on_the_thread_count_or_the_isa",
            "tests/test_stats.py::test_every_column_matches_the_reference",
        ],
        "what": "the AVX-512 counts' loop forgets the zeros of its second register",
        "requires": "avx512",
    },
    {
        "name": "cpp-every-isa-drops-the-tail",
        "path": "csrc/kernels_impl.h",
        "old": "      add_tail<E, Power>(acc, x + i, n - i);\n",
        "new": "",
        "tests": ["tests/test_cpu_kernels.py::test_every_instruction_set_gives_the_same_bits"],
        "what": "every instruction set drops a piece's last partial block alike: they agree, all wrong",
    },
    # ------------------------------------------------------------------
    # Triton kernels (fastnorm/backends/triton_kernels.py, triton_backend.py)
    # ------------------------------------------------------------------
    {
        "name": "triton-stats-padding-counted-as-zeros",
        "path": "fastnorm/backends/triton_kernels.py",
        "old": "        lanes = tl.cdiv(n, RUN) * RUN",
        "new": "        lanes = (n // RUN) * RUN",
        "tests": ["tests/test_stats.py::test_triton_counts_every_value_once_across_chunk_and_run_edges"],
        "what": "a chunk's masked tail: its padding counted among the subnormals (lanes of whole runs only)",
    },
    {
        "name": "triton-stats-tail-not-counted",
        "path": "fastnorm/backends/triton_kernels.py",
        "old": (
            "            x = _load_run(chunk_ptr, num_runs * RUN, n, R, ROWS, VEC, True)\n"
            "            part, run_top = _run_sum(x, 0, DTYPE, CDT, one, False)\n"
            "            acc += part.to(tl.float64)\n"
            "            top = tl.maximum(top, run_top)\n"
            "            both += _run_small(x, DTYPE, CDT, TINY_BITS)\n"
        ),
        "new": (
            "            x = _load_run(chunk_ptr, num_runs * RUN, n, R, ROWS, VEC, True)\n"
            "            part, run_top = _run_sum(x, 0, DTYPE, CDT, one, False)\n"
            "            acc += part.to(tl.float64)\n"
            "            top = tl.maximum(top, run_top)\n"
        ),
        "tests": ["tests/test_stats.py::test_triton_counts_every_value_once_across_chunk_and_run_edges"],
        "what": "the zeros and subnormals of a chunk's masked tail are not counted",
    },
    {
        "name": "triton-stats-no-second-read",
        "path": "fastnorm/backends/triton_kernels.py",
        "old": "        if top_bits > MARGIN_BITS:\n",
        "new": "        if top_bits > INF_BITS + MARGIN_BITS:\n",
        "tests": ["tests/test_stats.py::test_triton_counts_every_value_once_across_chunk_and_run_edges"],
        "what": "a chunk with a non-finite or overflowing value is not read again: none counted, NaN as max",
    },
    {
        "name": "triton-stats-max-from-first-chunk",
        "path": "fastnorm/backends/triton_backend.py",
        "old": "scatter_reduce_(0, of_chunk, chunk_rows[:, _stats.MAX_ABS], \"amax\")",
        "new": "scatter_reduce_(0, of_chunk, chunk_rows[:, _stats.MAX_ABS], \"amin\")",
        "tests": ["tests/test_stats.py::test_triton_counts_every_value_once_across_chunk_and_run_edges"],
        "what": "a tensor's largest |x| is the smallest of its chunks' maxima",
    },
    {
        "name": "triton-stats-serves-every-p",
        "path": "fastnorm/backends/triton_backend.py",
        "old": "        return mode == Mode.L2 and all(limit is None for limit in limits)\n",
        "new": "        return all(limit is None for limit in limits)\n",
        "tests": ["tests/test_stats.py::test_triton_hands_other_calls_to_torchs_rows"],
        "what": "the Triton statistics claim p != 2 calls (the kernel refuses them)",
    },
    {
        "name": "triton-per-tensor-keeps-last-chunk",
        "path": "fastnorm/backends/triton_kernels.py",
        "old": "    m, s = _reduce_rows(chunk_partial_ptr, start, end, p, MODE, BLOCK)",
        "new": "    m, s = _reduce_rows(chunk_partial_ptr, end - 1, end, p, MODE, BLOCK)",
        "tests": ["tests/test_norm.py::test_tensor_norms"],
        "what": "a tensor's own norm keeps only its last chunk",
    },
    {
        "name": "triton-scale-writes-without-clipping",
        "path": "fastnorm/backends/triton_kernels.py",
        "old": "    if (coef < 1.0) | (coef != coef):\n",
        "new": "    coef = tl.where(coef > 1.0, 1.0, coef)\n    if True:\n",
        "tests": ["tests/test_clip.py::test_no_clip_touches_no_memory"],
        "what": "the scale kernel rewrites every gradient (by 1.0) when nothing needs clipping",
    },
    {
        "name": "triton-clip-float32-drops-eps",
        "path": "fastnorm/backends/triton_kernels.py",
        "old": "coef = tl.math.div_rn(one, norm + tl.full((), 1e-6, tl.float32)) * max_norm.to(tl.float32)",
        "new": "coef = tl.math.div_rn(one, norm) * max_norm.to(tl.float32)",
        "tests": ["tests/test_clip.py::test_bitwise_equal_to_torch_given_the_same_norm"],
        "what": "the clip coefficient of a float32 norm without torch's + 1e-6",
    },
    {
        "name": "triton-float32-underflow-unchecked",
        "path": "fastnorm/backends/triton_kernels.py",
        "old": "            lost = lost | (nonzero & (s < tl.full((), F32_TRUSTED_MIN, tl.float64)))",
        "new": "            lost = lost",
        "tests": ["tests/test_triton_kernels.py::test_squares_below_float32_range_are_summed_in_float64"],
        "what": "float32 squares lost to underflow are trusted",
    },
    {
        "name": "triton-linf-merge-drops-nan",
        "path": "fastnorm/backends/triton_kernels.py",
        "old": "    return tl.where((a > b) | (a != a), a, b)",
        "new": "    return tl.where(a > b, a, b)",
        "tests": ["tests/test_norm.py::test_nan_and_inf_propagate"],
        "what": "the max of two chunks drops a NaN (p=inf)",
    },
    {
        "name": "triton-tail-mask-off-by-one",
        "path": "fastnorm/backends/triton_kernels.py",
        "old": "        return tl.load(chunk_ptr + idx, mask=idx < n, other=0.0)",
        "new": "        return tl.load(chunk_ptr + idx, mask=idx < n - 1, other=0.0)",
        "tests": ["tests/test_triton_kernels.py::test_every_tail_length"],
        "what": "the masked tail of a chunk misses its last element",
    },
    {
        "name": "triton-l2-rescale-one-ratio",
        "path": "fastnorm/backends/triton_kernels.py",
        "old": '    return tl.where((s == float("inf")) | (s == 0), s, finite * ratio * ratio)',
        "new": '    return tl.where((s == float("inf")) | (s == 0), s, finite * ratio)',
        "tests": ["tests/test_triton_kernels.py::test_float64_extremes_are_scaled_and_accurate"],
        "what": "a scaled L2 sum moved to a larger scale by the ratio, not its square",
    },
    {
        "name": "triton-programs-skip-last-chunk",
        "path": "fastnorm/backends/triton_kernels.py",
        "old": (
            "    run_s = tl.zeros((), tl.float64)\n"
            "    for c in range(pid, num_chunks, tl.num_programs(0)):\n"
        ),
        "new": (
            "    run_s = tl.zeros((), tl.float64)\n"
            "    for c in range(pid, num_chunks - 1, tl.num_programs(0)):\n"
        ),
        "tests": ["tests/test_norm.py::test_matches_oracle"],
        "what": "the programs never read the last chunk",
    },
    {
        "name": "triton-per-tensor-order-not-inverted",
        "path": "fastnorm/backends/triton_backend.py",
        "old": "            order[torch.tensor(grouped)] = torch.arange(len(tensors))",
        "new": "            order = torch.tensor(grouped)",
        "tests": ["tests/test_norm.py::test_tensor_norms"],
        "what": "per-tensor norms of mixed dtypes put back by the permutation, not its inverse",
    },
    # ------------------------------------------------------------------
    # The front (fastnorm/_collect.py, norm.py, _partial.py)
    # ------------------------------------------------------------------
    {
        "name": "front-forced-backend-reads-gapped-views",
        "path": "fastnorm/backends/fused.py",
        "old": "    if not dense:\n        reasons.append(NOT_DENSE)\n",
        "new": "",
        "tests": ["tests/test_norm.py::test_a_forced_backend_refuses_what_it_does_not_serve"],
        "what": "a forced fused backend takes a view with gaps and reads memory that is not the tensor's",
    },
    {
        "name": "plan-key-ignores-how-items-are-read",
        "path": "fastnorm/_plan.py",
        "old": 'getattr(items, "gradients", False), len(items), first, last)',
        "new": "len(items), first, last)",
        "tests": ["tests/test_norm.py::test_gradients_true_reads_every_tensor_as_given_as_torch_does"],
        "what": "a plan cached for the parameters' .grad serves a call that reads their values",
    },
    {
        "name": "front-no-gradient-is-silent",
        "path": "fastnorm/norm.py",
        "old": "    elif plan.no_gradient:\n",
        "new": "    elif False:\n",
        "tests": ["tests/test_clip.py::test_items_without_any_gradient_warn_once_per_call_site"],
        "what": "parameters without a .grad (before backward) give 0 without a word",
    },
    {
        "name": "front-dtensor-norm-read-as-local",
        "path": "fastnorm/norm.py",
        "old": "        norm = norm.full_tensor()\n",
        "new": "        norm = norm._local_tensor\n",
        "tests": ["tests/test_distributed.py::test_a_dtensor_norm_given_to_clip_is_its_full_value"],
        "what": "a DTensor norm given to clip_ is read as its local shard, not its full value",
    },
    {
        "name": "front-dedup-ignores-numel",
        "path": "fastnorm/_collect.py",
        "old": "            key = (norm_t.device, norm_t.data_ptr(), norm_t.dtype, norm_t.numel())",
        "new": "            key = (norm_t.device, norm_t.data_ptr(), norm_t.dtype)",
        "tests": ["tests/test_norm.py::test_same_tensor_twice_counts_once"],
        "what": "a view of a tensor's first elements counts as the tensor itself (deduplicated)",
    },
    {
        "name": "front-group-without-tensors-skips-collective",
        "path": "fastnorm/_collect.py",
        "old": "        domain_id(plain)  # group= always joins its collective, even with no tensor here",
        "new": "        pass",
        "tests": ["tests/test_distributed.py::test_group_and_dtensors_where_a_rank_holds_no_plain_gradient"],
        "what": "a rank without plain gradients does not join group='s collective (the others hang)",
    },
    {
        "name": "front-complex128-gives-float32",
        "path": "fastnorm/_collect.py",
        "old": "            if grad.dtype in (torch.float64, torch.complex128):",
        "new": "            if grad.dtype == torch.float64:",
        "tests": ["tests/test_norm.py::test_complex_gradients_for_p2"],
        "what": "complex128 gradients give a float32 norm",
    },
    {
        "name": "front-clip-writes-before-finite-check",
        "path": "fastnorm/_eager.py",
        "old": (
            "        if error_if_nonfinite:\n"
            "            check_finite(norm, p)\n"
            "        torch._C._increment_version(written)\n"
            "        with torch.no_grad():\n"
            "            _scale(plan, norm, max_norm)\n"
        ),
        "new": (
            "        torch._C._increment_version(written)\n"
            "        with torch.no_grad():\n"
            "            _scale(plan, norm, max_norm)\n"
            "        if error_if_nonfinite:\n"
            "            check_finite(norm, p)\n"
        ),
        "tests": ["tests/test_clip.py::test_error_if_nonfinite_raises_before_scaling"],
        "what": "error_if_nonfinite raises after the gradients were scaled",
    },
    {
        "name": "front-clip-bumps-no-version",
        "path": "fastnorm/_eager.py",
        "old": "    torch._C._increment_version(written)\n",
        "new": "",
        "tests": ["tests/test_clip.py::test_every_gradient_that_may_be_written_has_its_version_bumped"],
        "what": "clip_ writes in place without autograd seeing it",
    },
    {
        "name": "front-overlap-check-wrong-code",
        "path": "fastnorm/_eager.py",
        "old": "torch._debug_has_internal_overlap(local) == 1:",
        "new": "torch._debug_has_internal_overlap(local) == 2:",
        "tests": ["tests/test_clip.py::test_expanded_gradient_is_refused_before_anything_is_written"],
        "what": "an expanded gradient (elements sharing memory) is scaled instead of refused",
    },
    {
        "name": "front-plain-item-norms-reduced-across-ranks",
        "path": "fastnorm/distributed.py",
        "old": '        if domain.groups and domain.key[0] == "mesh":',
        "new": "        if domain.groups:",
        "tests": ["tests/test_distributed.py::test_group_tensor_norms_with_uneven_items"],
        "what": "with group=, each plain item's own norm is all-reduced as if it were a shard",
    },
    {
        "name": "front-l2-merge-inf-times-zero",
        "path": "fastnorm/_partial.py",
        "old": "    moved = torch.where(torch.isfinite(s), s * ratio.square(), s)",
        "new": "    moved = s * ratio.square()",
        "tests": ["tests/test_backends.py::test_non_finite_l2_sums_stay_non_finite_when_moved"],
        "what": "an inf L2 sum moved to a larger scale becomes NaN (inf * 0)",
    },
    {
        "name": "front-l2-sum-overflow-in-addition-kept",
        "path": "fastnorm/_partial.py",
        "old": "    overflow = torch.isinf(plain) & torch.isfinite(wide)",
        "new": "    overflow = torch.zeros_like(plain, dtype=torch.bool)",
        "tests": ["tests/test_float64_range.py"],
        "what": "float64 L2 sums that overflow only when added give inf, not the finite norm",
    },
    {
        "name": "front-lp-merge-ratio-unguarded",
        "path": "fastnorm/_partial.py",
        "old": "    ratio = torch.where(m == top, torch.ones_like(m), m / top)",
        "new": "    ratio = m / top",
        "tests": ["tests/test_norm.py::test_p_norm_of_partials_from_two_backends_with_zeros_and_inf"],
        "what": "merging p-norm partials divides 0 by 0 and inf by inf",
    },
    {
        "name": "cpp-backend-unknown-isa-falls-back",
        "path": "fastnorm/backends/cpp.py",
        "old": '        if _extension.BAD_SETTING is not None and device.type == "cpu":\n'
        "            raise ValueError(_extension.BAD_SETTING)\n",
        "new": "",
        "tests": ["tests/test_cpu_kernels.py::test_an_unknown_instruction_set_raises_naming_the_known_ones"],
        "what": "a mistyped FASTNORM_ISA hands every CPU tensor to the torch backend instead of raising",
    },
    {
        "name": "front-l2-merge-at-the-first-scale",
        "path": "fastnorm/_partial.py",
        "old": "        top = l2_top(m, s)\n",
        "new": "        top = l2_active_scale(m, s)[0]\n",
        "tests": ["tests/test_float64_range.py::test_groups_of_any_magnitudes_combine_to_the_norm"],
        "what": "the groups' float64 L2 partials merge at the first group's scale, not the largest",
    },
    # ------------------------------------------------------------------
    # The plan cache (fastnorm/_plan.py)
    # ------------------------------------------------------------------
    {
        "name": "plan-cache-evicts-in-insertion-order",
        "path": "fastnorm/_plan.py",
        "old": "            self._entries.move_to_end(key)  # atomic under the GIL, as are the dict's reads",
        "new": "            pass",
        "tests": [
            "tests/test_plan_cache.py::test_past_its_size_the_cache_forgets_the_list_used_least_recently"
        ],
        "what": "a hit does not make a list the most recently used: the oldest is evicted, in use or not",
    },
    {
        "name": "plan-key-ignores-group",
        "path": "fastnorm/_plan.py",
        "old": "return (request, id(group), mode,",
        "new": "return (request, mode,",
        "tests": [
            "tests/test_distributed.py::test_a_plan_cached_without_group_never_serves_a_call_with_group"
        ],
        "what": "a plan cached without group= serves the same parameters with it: the local norm",
    },
    {
        "name": "plan-new-gradients-not-held",
        "path": "fastnorm/_plan.py",
        "old": "    if held is not None:\n        held.extend(grads.norm)\n",
        "new": "",
        "tests": ["tests/test_plan_cache.py::test_a_gradient_dropped_during_the_check_is_read_as_it_was"],
        "what": "a new plan's gradients are not kept: one dropped while others are collected is read freed",
    },
    {
        "name": "plan-key-ignores-backend-request",
        "path": "fastnorm/_plan.py",
        "old": "    return (request, id(group), mode,",
        "new": "    return (id(group), mode,",
        "tests": ["tests/test_backends.py::test_request_is_read_at_every_call"],
        "what": "a plan cached for one FASTNORM_BACKEND is reused under another",
    },
    {
        "name": "plan-python-snapshot-skips-strides",
        "path": "fastnorm/_plan.py",
        "old": "if not all((tensors[i].shape, tensors[i].stride()) == layout for",
        "new": "if not all(True for",
        "tests": ["tests/test_plan_cache.py::test_channels_last_gradients_keep_their_strides"],
        "what": "the Python snapshot misses new strides of a dense, non-contiguous gradient",
    },
    {
        "name": "plan-python-snapshot-holds-items",
        "path": "fastnorm/_plan.py",
        "old": "        self.ids = list(map(id, items))\n",
        "new": "        self.ids = list(map(id, items))\n        _PySnapshot.held = items\n",
        "tests": ["tests/test_plan_cache.py::test_the_cache_keeps_no_item_or_gradient_alive"],
        "what": "the Python snapshot keeps every item (and so its gradient) alive",
    },
    {
        "name": "plan-caches-torch-backend-plans",
        "path": "fastnorm/_plan.py",
        "old": "    cacheable = grads.cacheable and not subclassed and all(g.backend.cacheable for g in norm_groups)",
        "new": "    cacheable = grads.cacheable and not subclassed",
        "tests": ["tests/test_backends.py::test_cache_does_not_keep_gradients_alive"],
        "what": "plans whose backend state holds the gradients are cached (and keep them alive)",
    },
    {
        "name": "plan-gapped-views-to-fused-backend",
        "path": "fastnorm/_plan.py",
        "old": "[0 if flat else 1].append(i)",
        "new": "[0].append(i)",
        "tests": ["tests/test_norm.py::test_mixed_dtypes_and_layouts"],
        "what": "a view with gaps goes to a fused backend, which reads it as flat memory",
    },
    {
        "name": "plan-collective-order-first-appearance",
        "path": "fastnorm/distributed.py",
        "old": "    return sorted(range(len(domains)), key=lambda i: repr(domains[i].key))",
        "new": "    return list(range(len(domains)))",
        "tests": ["tests/test_distributed.py::test_group_and_dtensors_where_a_rank_holds_no_plain_gradient"],
        "what": "collectives run in each rank's order of first appearance, not an agreed one",
    },
    # ------------------------------------------------------------------
    # The distributed stage (fastnorm/distributed.py)
    # ------------------------------------------------------------------
    {
        "name": "dist-nan-flag-dropped",
        "path": "fastnorm/distributed.py",
        "old": '    return torch.where(flagged[k:] > 0, torch.full_like(m, float("nan")), top)',
        "new": "    return top",
        "tests": ["tests/test_distributed.py::test_nan_on_one_rank_reaches_every_rank"],
        "what": "a NaN on one rank is lost in the MAX across ranks",
    },
    {
        "name": "dist-replicate-summed-over-ranks",
        "path": "fastnorm/distributed.py",
        "old": "tuple(d for d, placement in enumerate(t.placements) if placement.is_shard())",
        "new": "tuple(range(len(t.placements)))",
        "tests": ["tests/test_distributed.py::test_dtensor_shard_and_replicate"],
        "what": "a replicated DTensor counts once per rank",
    },
    {
        "name": "dist-l2-sums-left-at-local-scale",
        "path": "fastnorm/distributed.py",
        "old": (
            "        moved = [_partial.l2_rescaled(m, s, top), "
            "_partial.l2_rescaled(m, s, _partial.l2_wide_top(top))]"
        ),
        "new": (
            "        own = _partial.l2_active_scale(m, s)\n"
            "        moved = [_partial.l2_rescaled(m, s, own), "
            "_partial.l2_rescaled(m, s, _partial.l2_wide_top(own))]"
        ),
        "tests": ["tests/test_distributed.py::test_l2_partials_of_every_scale_merge_across_ranks"],
        "what": "scaled L2 sums are added across ranks without moving them to the global scale",
    },
    # ------------------------------------------------------------------
    # The monitor (fastnorm/monitoring/monitor.py)
    # ------------------------------------------------------------------
    {
        "name": "monitor-window-drops-last-step",
        "path": "fastnorm/monitoring/monitor.py",
        "old": "        values = host[:k]\n",
        "new": "        values = host[: k - 1]\n",
        "tests": ["tests/test_monitor.py::test_every_step_reaches_the_loggers_in_one_transfer_per_window"],
        "what": "a window loses its last step's norm",
    },
    {
        "name": "monitor-float64-norms-in-float32",
        "path": "fastnorm/monitoring/monitor.py",
        "old": '            dtype = torch.float64 if wide or device.type == "cpu" else torch.float32',
        "new": "            dtype = torch.float32",
        "tests": ["tests/test_monitor.py::test_float64_norms_keep_their_precision"],
        "what": "float64 norms are kept in a float32 buffer",
    },
    {
        "name": "monitor-skip-flags-read-from-loss-row",
        "path": "fastnorm/monitoring/monitor.py",
        "old": "        codes = tuple(host[_SKIPPED * n + i] if given",
        "new": "        codes = tuple(host[_LOSS * n + i] if given",
        "tests": ["tests/test_monitor.py::test_skip_flags_cross_in_the_same_transfer_and_are_counted"],
        "what": "the skip flags are read from the loss's row of the buffer",
    },
    {
        "name": "monitor-failing-logger-stops-the-others",
        "path": "fastnorm/monitoring/monitor.py",
        "old": '-{steps[-1]}")\n',
        "new": '-{steps[-1]}")\n                break\n',
        "tests": [
            "tests/test_monitor.py::test_a_failing_logger_is_reported_once_and_the_others_get_every_window"
        ],
        "what": "a logger that raises keeps the loggers after it from the window",
    },
    # ------------------------------------------------------------------
    # The loggers (fastnorm/monitoring/loggers.py)
    # ------------------------------------------------------------------
    {
        "name": "tensorboard-closes-a-given-writer",
        "path": "fastnorm/monitoring/loggers.py",
        "old": "        if self._owned:\n            self.writer.close()\n",
        "new": "        if True:\n            self.writer.close()\n",
        "tests": ["tests/test_loggers.py::test_tensorboard_leaves_a_given_writer_open"],
        "what": "TensorBoardLogger.close closes a writer its caller owns",
    },
    {
        "name": "stats-count-skipped-steps-as-clipped",
        "path": "fastnorm/monitoring/loggers.py",
        "old": "        applied = [v for i, v in enumerate(values) if not (i < len(skipped) and skipped[i])]",
        "new": "        applied = values",
        "tests": ["tests/test_loggers.py::test_the_skip_flags_are_logged_at_their_step_and_counted_last"],
        "what": "the clipped fraction counts the steps the optimizer skipped",
    },
    {
        "name": "stats-clip-threshold-without-eps",
        "path": "fastnorm/monitoring/loggers.py",
        "old": "        clipped = sum(max_norm < v + 1e-6 for v in applied)",
        "new": "        clipped = sum(max_norm < v for v in applied)",
        "tests": ["tests/test_monitor.py::test_clipped_fraction_counts_what_clip_scales_near_max_norm"],
        "what": "a norm within 1e-6 below max_norm, which clip_ scales, is not counted as clipped",
    },
    {
        "name": "jsonl-appends-by-default",
        "path": "fastnorm/monitoring/loggers.py",
        "old": 'def __init__(self, path: str | os.PathLike, mode: str = "w")',
        "new": 'def __init__(self, path: str | os.PathLike, mode: str = "a")',
        "tests": ["tests/test_loggers.py::test_jsonl_starts_afresh_by_default_and_appends_on_request"],
        "what": "a new run appends to an old run's metrics.jsonl",
    },
    {
        "name": "window-statistics-at-first-step",
        "path": "fastnorm/monitoring/loggers.py",
        "old": "            if i == last:\n",
        "new": "            if i == 0:\n",
        "tests": ["tests/test_loggers.py::test_metrics_put_each_value_at_its_step_and_the_statistics_last"],
        "what": "a window's statistics are logged at its first step",
    },
    # ------------------------------------------------------------------
    # The diagnosis (fastnorm/monitoring/diagnosis/)
    # ------------------------------------------------------------------
    {
        "name": "diag-deep-plateau-without-its-cut",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "            if plateau is None or self._lr_cut(plateau[0], last, 100.0) is None:\n",
        "new": "            if plateau is None or self._lr_cut(plateau[0], last, 100.0) is not None:\n",
        "tests": [
            "tests/test_diagnosis.py::test_a_loss_that_fell_by_half_then_stopped_at_a_logged_rate_cut_is_a_stall"
        ],
        "what": "a loss that fell by half is a plateau only where no rate cut explains it: the evidence inverted",
    },
    {
        "name": "diag-plateau-hidden-by-any-warmup",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        return plateau if until is None or until < plateau[0] + (last - plateau[0]) / 2 else None\n",
        "new": "        return plateau if until is None else None\n",
        "tests": ["tests/test_diagnosis.py::test_a_plateau_after_a_logged_warmup_is_a_stall_whose_schedule_is_named"],
        "what": "a plateau after a logged warmup is read as stable, however long ago the warmup ended",
    },
    {
        "name": "diag-plateau-ignores-the-rate-cut",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        change = self._lr_cut(step, last)\n",
        "new": "        change = None\n",
        "tests": ["tests/test_diagnosis.py::test_a_plateau_after_a_logged_warmup_is_a_stall_whose_schedule_is_named"],
        "what": "a plateau where the logged rate was cut 10^4x leads with generic stall advice",
    },
    {
        "name": "diagnosis-thresholds-swapped",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "        return self.explode_orders if side > 0 else self.vanish_orders",
        "new": "        return self.vanish_orders if side > 0 else self.explode_orders",
        "tests": ["tests/test_diagnosis.py"],
        "what": "a rise is judged by the vanishing threshold and a fall by the exploding one",
    },
    {
        "name": "diagnosis-zero-is-invalid",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        if value is None or value < 0:\n            skips.invalid_value(step, raw)",
        "new": "        if value is None or value <= 0:\n            skips.invalid_value(step, raw)",
        "tests": ["tests/test_diagnosis.py::test_zero_norm_reads_as_vanishing"],
        "what": "an exact zero norm is reported as an invalid value, not as vanishing",
    },
    {
        "name": "diagnosis-new-normal-test-inverted",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "        if dep.held(self.window) and not self._alarming(dep):",
        "new": "        if dep.held(self.window) and self._alarming(dep):",
        "tests": ["tests/test_diagnosis.py"],
        "what": "a sustained explosion is taken for a new normal, a mild shift is not",
    },
    {
        "name": "diagnosis-side-inverted",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "        side = 0 if abs(dev) <= base.band else (1 if dev > 0 else -1)",
        "new": "        side = 0 if abs(dev) <= base.band else (1 if dev < 0 else -1)",
        "tests": ["tests/test_diagnosis.py"],
        "what": "a departure above the band is read as a fall, below as a rise",
    },
    {
        "name": "diagnosis-nonfinite-to-the-end-read-as-skipped",
        "path": "fastnorm/monitoring/diagnosis/skips.py",
        "old": "            persists = r.open and (not loss_logged or r.longer_than(self.max_skip_run))",
        "new": "            persists = r.open and r.longer_than(self.max_skip_run)",
        "tests": ["tests/test_diagnosis.py"],
        "what": "non-finite norms to the last step, with no loss to tell, read as skipped steps",
    },
    {
        "name": "diagnosis-warmup-counts-points-only",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "        return not held(len(self._base), self._previous - self._first + 1, self.warmup)",
        "new": "        return len(self._base) < self.warmup",
        "tests": ["tests/test_diagnosis.py::test_a_thinned_log_judges_its_first_points"],
        "what": "the baseline's warm-up counts points only: a thinned log's first 100 steps go unjudged",
    },
    {
        "name": "diagnosis-sustain-counts-points-only",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "        return held(self.count, self.end - self.first + 1, n)",
        "new": "        return self.count >= n",
        "tests": [
            "tests/test_diagnosis.py::test_a_level_is_sustained_over_10_steps_or_10_points_and_3_points_at_least",
            "tests/test_diagnosis.py::test_a_new_normal_is_a_window_of_points_or_of_steps",
        ],
        "what": "a departure's sustain and new-normal rules count points only (100 steps on a thinned log)",
    },
    {
        "name": "diagnosis-thinned-mean-overflows",
        "path": "fastnorm/monitoring/diagnosis/robust.py",
        "old": "        self.points.append((pending[0][0], mean([v for _, v in pending])))",
        "new": "        self.points.append((pending[0][0], math.fsum(v for _, v in pending) / len(pending)))",
        "tests": [
            "tests/test_diagnosis.py::test_a_long_log_of_losses_near_the_largest_float_is_read"
        ],
        "what": "a thinned log's mean of losses near 1.8e308 raises OverflowError (a traceback)",
    },
    {
        "name": "window-mean-shares-overflow",
        "path": "fastnorm/monitoring/diagnosis/robust.py",
        "old": (
            "        return math.fsum(v / len(values) for v in values)\n"
            "    except OverflowError:\n        return _halved_mean(values)\n\n\ndef _halved"
        ),
        "new": (
            "        return math.fsum(v / len(values) for v in values)\n"
            "    except ZeroDivisionError:\n        return _halved_mean(values)\n\n\ndef _halved"
        ),
        "tests": [
            "tests/test_loggers.py::test_a_window_of_norms_near_the_largest_float_is_logged_with_its_mean"
        ],
        "what": "a window of float64 norms near 1.8e308 raises OverflowError from the monitor's update",
    },
    {
        "name": "diagnosis-thinned-pairs-sum-to-inf",
        "path": "fastnorm/monitoring/diagnosis/robust.py",
        "old": "(a[0], midpoint(a[1], b[1]))",
        "new": "(a[0], 0.5 * (a[1] + b[1]))",
        "tests": [
            "tests/test_diagnosis.py::test_a_long_log_of_losses_near_the_largest_float_is_read"
        ],
        "what": "two finite losses near 1.8e308 averaged into inf: a finite log read as non-finite",
    },
    {
        "name": "diagnosis-held-on-one-point",
        "path": "fastnorm/monitoring/diagnosis/robust.py",
        "old": "MIN_HELD = 3",
        "new": "MIN_HELD = 1",
        "tests": [
            "tests/test_diagnosis.py::test_a_level_is_sustained_over_10_steps_or_10_points_and_3_points_at_least"
        ],
        "what": "a rule counted in steps is met by one or two points of a thinned log",
    },
    {
        "name": "diagnosis-level-over-the-last-points",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": (
            "            if len(tail) >= MIN_HELD and self.end - step + 1 > sustain:\n                break\n"
        ),
        "new": "",
        "tests": ["tests/test_diagnosis.py::test_a_departures_level_is_that_of_its_last_10_steps"],
        "what": "a thinned log's sustained level is that of its last 10 points (100 steps), not 10 steps",
    },
    {
        "name": "diagnosis-recover-counts-points-only",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "        return held(len(dep.pending) + 1, step - since + 1, self.recover)",
        "new": "        return len(dep.pending) + 1 >= self.recover",
        "tests": ["tests/test_diagnosis.py::test_a_return_to_the_band_is_recover_points_or_steps"],
        "what": "a return to the band counts points only",
    },
    {
        "name": "diagnosis-skip-run-counts-points-only",
        "path": "fastnorm/monitoring/diagnosis/skips.py",
        "old": "        return held(self.count, self.end - self.start + 1, n + 1)",
        "new": "        return self.count > n",
        "tests": [
            "tests/test_diagnosis.py::test_nonfinite_norms_to_the_end_are_a_collapse_after_40_steps_or_40_points"
        ],
        "what": "non-finite norms to the end of a thinned log collapse only after 40 points (400 steps)",
    },
    {
        "name": "diagnosis-early-blowup-moves-with-its-way-down",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "            while j < len(ys) and ys[j] > 5 * before:\n                j += 1\n",
        "new": "",
        "tests": ["tests/test_diagnosis.py::test_a_blowup_in_a_thinned_logs_first_window_is_seen_there"],
        "what": "an early blow-up is measured against moves that hold its own way down",
    },
    {
        "name": "diagnosis-lr-jump-loss-jump-missed",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "                    if after >= 10 * before and after - before > self.tol:",
        "new": "                    if after >= 1000 * before and after - before > self.tol:",
        "tests": [
            "tests/test_diagnosis.py::test_a_loss_that_jumps_just_after_the_learning_rate_is_diverged_from_the_jump"
        ],
        "what": "a loss 100x up just after a learning-rate jump waits for the norm to leave a wide band",
    },
    {
        "name": "diagnosis-lr-jump-without-a-jump",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "            if self._ev.ramp(change) or not (after < 0 or abs(after) > 2 * abs(before)):",
        "new": "            if self._ev.ramp(change):",
        "tests": [
            "tests/test_diagnosis.py::test_a_learning_rate_jump_alone_or_a_loss_that_came_back_is_no_divergence"
        ],
        "what": "any change of the learning rate (30%) is taken for the cause of a loss jump",
    },
    {
        "name": "diagnosis-lr-jump-loss-came-back",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "        if not self.final >= 10 * before:\n            return None\n",
        "new": "",
        "tests": [
            "tests/test_diagnosis.py::test_a_learning_rate_jump_alone_or_a_loss_that_came_back_is_no_divergence"
        ],
        "what": "a loss that came back after a learning-rate jump stays a divergence",
    },
    {
        "name": "diagnosis-stall-outranks-lr-jump",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": (
            "            if loss is not None and blowup is None and (read is None or read.kind == STALLED)"
        ),
        "new": "            if loss is not None and blowup is None and read is None",
        "tests": [
            "tests/test_diagnosis.py::"
            "test_a_burst_of_the_learning_rate_that_leaves_the_loss_at_chance_is_diverged_not_stalled"
        ],
        "what": "a burst of the learning rate that leaves the loss at chance is called stalled",
    },
    {
        "name": "diagnosis-noisy-plateau-asks-for-warmup",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "    if (stall.never or stall.plateau is not None) and stall.noise >= NOISY:",
        "new": "    if stall.never and stall.noise >= NOISY:",
        "tests": [
            "tests/test_diagnosis.py::test_larger_batches_come_before_the_warmup_for_a_plateau_that_follows_its_batches"
        ],
        "what": "a plateau whose loss follows its batches asks for a warmup first",
    },
    {
        "name": "diagnosis-drift-end-not-followed",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "        drift.end = step\n        drift.high = base.median",
        "new": "        drift.high = base.median",
        "tests": ["tests/test_diagnosis.py::test_a_slow_rise_that_levels_off_ends_where_it_stopped_rising"],
        "what": "a slow rise that levels off ends where it was first seen, not where it stopped rising",
    },
    {
        "name": "diagnosis-too-few-points-judged",
        "path": "fastnorm/monitoring/diagnosis/events.py",
        "old": "MIN_POINTS = 5  #",
        "new": "MIN_POINTS = 1  #",
        "tests": ["tests/test_diagnosis.py::test_too_few_points_is_a_verdict_that_never_passes"],
        "what": "a log of a few points is judged stable",
    },
    {
        "name": "diagnosis-crossing-named-where-it-left-its-best",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": '                f"({num(self.first)}) from step {self.steps[k]} and stayed there: {s}"',
        "new": '                f"({num(self.first)}) from step {start} and stayed there: {s}"',
        "tests": ["tests/test_diagnosis.py::test_the_loss_line_names_where_it_crossed_its_initial_level"],
        "what": "the report says the loss rose above its initial level where it only left its best",
    },
    {
        "name": "diagnosis-early-blowup-missed",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "            if not (before > 0 and ys[i] > 5 * before and ys[i] > max(ys[:i])):",
        "new": "            if not (before > 0 and ys[i] > 50 * before and ys[i] > max(ys[:i])):",
        "tests": [
            "tests/test_diagnosis.py::test_a_blowup_in_the_first_steps_then_a_loss_at_chance_is_diverged_not_stalled"
        ],
        "what": "a blow-up in the first steps followed by a loss at chance is called stalled",
    },
    {
        "name": "diagnosis-labels-never-suspected",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "    elif stall.chance is not None and norm_steady:",
        "new": "    elif False:",
        "tests": [
            "tests/test_diagnosis.py::test_a_loss_at_chance_from_the_start_with_normal_gradients_checks_the_labels",
            "tests/test_families.py",
        ],
        "what": "a loss at ln(classes) from the start with normal gradients gets no label advice",
    },
    {
        "name": "diagnosis-lr-jump-not-named",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "        causes = [c for c in causes if c[2] < 0 or moved(c) > math.log(2.0)]",
        "new": "        causes = [c for c in causes if c[2] < 0 or moved(c) > math.log(200.0)]",
        "tests": [
            "tests/test_diagnosis.py::test_a_learning_rate_change_that_causes_a_blowup_is_named_and_dates_it"
        ],
        "what": "a 30x learning-rate jump before a blow-up is not named as its cause",
    },
    {
        "name": "diagnosis-cause-only-near-the-rise",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "        end = max(start, until if until is not None else start) + reach\n",
        "new": "        end = start + reach\n",
        "tests": [
            "tests/test_diagnosis.py::test_a_learning_rate_jump_inside_a_bursty_departure_dates_the_divergence"
        ],
        "what": "a jump inside a bursty norm's departure, before the loss turned, neither dates nor names it",
    },
    {
        "name": "diagnosis-jump-dated-after-the-reading-before",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "        return start if previous < start <= step else step\n",
        "new": "        return previous + 1\n",
        "tests": [
            "tests/test_diagnosis.py::test_a_loss_that_jumps_just_after_the_learning_rate_is_diverged_from_the_jump"
        ],
        "what": "a jump read between two readings is dated after the first, not at the reading that shows it",
    },
    {
        "name": "diagnosis-chance-named-by-a-noisy-loss",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "        return k if self.noise_tol < up and abs(self.final - at)",
        "new": "        return k if abs(self.final - at)",
        "tests": ["tests/test_diagnosis.py::test_a_loss_too_noisy_to_name_its_classes_is_not_at_chance"],
        "what": "a loss whose noise spans more than the gap to ln(k+1) is read as at chance for k classes",
    },
    {
        "name": "diagnosis-chance-start-within-3-percent",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "        return k if -down <= self.first - at <= up else None",
        "new": "        return k if abs(self.first - at) < 0.03 * at else None",
        "tests": [
            "tests/test_diagnosis.py::test_a_loss_at_chance_after_its_initial_offset_checks_the_labels"
        ],
        "what": "a start lifted 4% above ln k by the initial logits is not at chance",
    },
    {
        "name": "diagnosis-noisy-start-over-5-points",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "        start = ys[:w] if self.noisy else head\n",
        "new": "        start = head\n",
        "tests": [
            "tests/test_diagnosis.py::test_a_loss_that_follows_its_batches_and_starts_high_never_improved"
        ],
        "what": "a loss that follows its batches is judged from 5 points: a few high first ones look learned",
    },
    {
        "name": "diagnosis-noisy-loss-judged-by-its-best",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "(self.final if self.noisy else self.best)",
        "new": "self.best",
        "tests": [
            "tests/test_diagnosis.py::test_a_loss_that_follows_its_batches_and_starts_high_never_improved"
        ],
        "what": "a loss that follows its batches is judged by its best, the least of its noise",
    },
    {
        "name": "diagnosis-noisy-loss-went-back-up-from-its-noise",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "        if not above and self.noisy and never:\n",
        "new": "        if False:\n",
        "tests": [
            "tests/test_diagnosis.py::test_a_loss_that_follows_its_batches_and_starts_high_never_improved"
        ],
        "what": "a loss that follows its batches and ends high is read as gone back up from its least batch",
    },
    {
        "name": "diagnosis-one-batch-below-the-start-blows-up",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": " and ys[i] > max(ys[:i])):",
        "new": "):",
        "tests": ["tests/test_diagnosis.py::test_one_bad_batch_below_the_runs_start_is_no_early_blowup"],
        "what": "one batch 25x its level but below the run's start is read as an early blow-up",
    },
    {
        "name": "diagnosis-negative-lr-read-as-a-jump",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "        if after < 0:\n",
        "new": "        if after < -1e30:\n",
        "tests": [
            "tests/test_diagnosis.py::test_a_learning_rate_change_that_causes_a_blowup_is_named_and_dates_it"
        ],
        "what": "a learning rate turned negative is not named (the schedule)",
    },
    {
        "name": "diagnosis-ramp-dated-at-its-first-reading",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "        return max(first[4] + 1, round(first[0] - steps_in))",
        "new": "        return first[3] + 1",
        "tests": ["tests/test_diagnosis.py::test_a_ramp_of_the_learning_rate_dates_the_blowup_from_its_foot"],
        "what": "a learning-rate ramp is dated from the reading that first shows it, not from its foot",
    },
    {
        "name": "diagnosis-fp32-advised-to-fp32",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": '    if kind in ("fp32", "fp64"):\n        return None',
        "new": '    if kind in ("fp64",):\n        return None',
        "tests": ["tests/test_diagnosis.py::test_an_explosion_never_advises_fp32_to_an_fp32_run"],
        "what": "an fp32 run is told to switch to fp32",
    },
    {
        "name": "diagnosis-grad-scaler-despite-a-scale",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": '    if ev.kind in ("fp16", "fp16-mixed") and not ev.scaled:',
        "new": '    if ev.kind in ("fp16", "fp16-mixed"):',
        "tests": ["tests/test_diagnosis.py::test_fp16_gradients_that_underflow_to_zero_get_the_grad_scaler"],
        "what": "a run whose loss scale is logged is told to add a GradScaler",
    },
    {
        "name": "diagnosis-lr-read-twice-ends-its-warmup",
        "path": "fastnorm/monitoring/diagnosis/schedule.py",
        "old": "        if self.last_step is not None and step <= self.last_step:\n            return",
        "new": "        if False:\n            return",
        "tests": ["tests/test_monitor.py::test_the_offline_diagnosis_sees_what_the_online_one_saw"],
        "what": "the window's last learning rate, read again beside its changes, ends a warmup online only",
    },
    {
        "name": "diagnosis-early-blowup-of-one-batch",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "if nxt < len(ys) and self.steps[nxt] - self.steps[i] <= 1 and not ys[nxt] > 5 * before:",
        "new": "if False:",
        "tests": [
            "tests/test_diagnosis.py::test_one_outlier_batch_in_a_log_of_every_step_is_no_early_blowup"
        ],
        "what": "one outlier batch, the next step's loss back at its level, reads as an early blow-up",
    },
    {
        "name": "diagnosis-early-blowup-needs-the-next-point-of-a-thinned-log",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "if nxt < len(ys) and self.steps[nxt] - self.steps[i] <= 1 and not ys[nxt] > 5 * before:",
        "new": "if nxt < len(ys) and not ys[nxt] > 5 * before:",
        "tests": [
            "tests/test_diagnosis.py::test_one_bad_batch_below_the_runs_start_is_no_early_blowup",
            "tests/test_families.py",
        ],
        "what": "a thinned log's blow-up must still show at its next point, steps later, after it recovered",
    },
    {
        "name": "diagnosis-plateau-of-a-loss-still-falling",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "        if earlier - later >= self.stall_fraction * abs(earlier):",
        "new": "        if False:",
        "tests": [
            "tests/test_families.py::test_a_floor_reached_early_that_the_loss_keeps_falling_from_is_no_plateau"
        ],
        "what": "a loss that fell to its floor early and kept falling 9% over the rest reads as a plateau",
    },
    {
        "name": "diagnosis-decay-near-zero-by-its-start",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "        return b < a - self.tol or (b <= 0.5 * a and b < a - self.noise_tol)",
        "new": "        return b < a - self.tol",
        "tests": [
            "tests/test_diagnosis.py::"
            "test_a_loss_near_zero_that_falls_further_as_the_norm_shrinks_is_a_healthy_decay"
        ],
        "what": "a loss near 0 that falls 100x further is held to 5% of its start: its decay reads vanishing",
    },
    {
        "name": "diagnosis-lost-all-only-with-the-norm",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "    lost = shape.above and end is None and loss.ended_at_chance() is None",
        "new": "    lost = False",
        "tests": [
            "tests/test_diagnosis.py::test_a_loss_that_climbs_above_its_start_and_chance_is_diverged_whatever_the_norm"
        ],
        "what": "a loss above its start and chance is a stall unless the norm left its band with it",
    },
    {
        "name": "diagnosis-lost-all-at-chance",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "    lost = shape.above and end is None and loss.ended_at_chance() is None",
        "new": "    lost = shape.above and end is None",
        "tests": ["tests/test_diagnosis.py::test_a_loss_that_settles_at_chance_above_its_start_is_a_stall"],
        "what": "a loss back at ln k, above a start that had already fallen, reads as a divergence",
    },
    {
        "name": "diagnosis-lost-all-above-a-noisy-start",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "robust = not self.noisy or self.final > start_level + max(self.tol, 0.1 * abs(start_level))",
        "new": "robust = True",
        "tests": [
            "tests/test_diagnosis.py::"
            "test_a_loss_that_follows_its_batches_ends_above_its_start_only_above_its_first_points"
        ],
        "what": "a loss that follows its batches ends above its start whenever its first 5 points were low",
    },
    {
        "name": "diagnosis-rise-while-learning-dates-the-divergence",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": " or loss.improved_after(a, start)",
        "new": "",
        "tests": [
            "tests/test_diagnosis.py::test_a_rise_while_the_loss_still_learns_does_not_date_its_divergence"
        ],
        "what": "a bursty rise under way while the loss went on to its best dates the divergence",
    },
    {
        "name": "diagnosis-improved-after-by-the-whole-runs-noise",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "        part = self.ys[i:j]\n",
        "new": "        part = self.ys\n",
        "tests": [
            "tests/test_diagnosis.py::test_a_rise_while_the_loss_still_learns_does_not_date_its_divergence",
        ],
        "what": "whether the loss still learned is read against the whole run's noise, its blow-up included",
    },
    {
        "name": "diagnosis-chance-overflows-on-a-blowup",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "        if not 0.5 < self.final < math.log(100_000.5):",
        "new": "        if not 0.5 < self.final:",
        "tests": ["tests/test_families.py"],
        "what": "the chance level of a loss that blew up to 1e6 overflows exp and the diagnosis raises",
    },
    {
        "name": "monitoring-imports-the-compute-core",
        "path": "fastnorm/monitoring/monitor.py",
        "old": "from fastnorm import checks\n",
        "new": "from fastnorm import checks\nfrom fastnorm.norm import tensor_norms  # noqa: F401\n",
        "tests": ["tests/test_monitoring_layout.py::test_monitoring_never_imports_the_compute_core"],
        "what": "the monitor imports the compute core again (per-layer norms computed inside monitoring)",
    },
    {
        "name": "monitor-never-withdraws",
        "path": "fastnorm/monitoring/alerts.py",
        "old": "        elif not d.unstable and self.alarms:",
        "new": "        elif False:",
        "tests": ["tests/test_monitor.py::test_a_warning_is_withdrawn_once_when_the_run_recovers"],
        "what": "a run that recovers keeps its warning: no recovered notice",
    },
    {
        "name": "monitor-warns-on-too-few-points",
        "path": "fastnorm/monitoring/alerts.py",
        "old": "            if not new:\n                return\n",
        "new": "",
        "tests": ["tests/test_monitor.py::test_no_warning_while_too_few_points_were_read"],
        "what": "the monitor warns at every unstable window, with nothing new: also on too few points",
    },
    {
        "name": "monitor-warns-only-when-the-verdict-changes",
        "path": "fastnorm/monitoring/alerts.py",
        "old": "if self.warned_at is None or e.start_step > self.warned_at or _key(e) not in self.warned_of",
        "new": "if d.verdict not in self.alarms",
        "tests": ["tests/test_monitor.py::test_a_new_fault_under_the_same_verdict_is_warned_of_again"],
        "what": "a fault that comes while an earlier alarm of the same verdict stands is never warned of",
    },
    {
        "name": "monitor-a-refined-date-is-news",
        "path": "fastnorm/monitoring/alerts.py",
        "old": "e.start_step > self.warned_at or",
        "new": "e.start_step != self.warned_at or",
        "tests": [
            "tests/test_monitor.py::test_warnings_follow_new_onsets_and_causes_and_are_withdrawn_together"
        ],
        "what": "an event warned of is warned of again each time its onset is refined",
    },
    {
        "name": "monitor-a-new-cause-is-no-news",
        "path": "fastnorm/monitoring/alerts.py",
        "old": " or _key(e) not in self.warned_of",
        "new": "",
        "tests": [
            "tests/test_monitor.py::test_warnings_follow_new_onsets_and_causes_and_are_withdrawn_together"
        ],
        "what": "a new cause of the same stall (another first action) brings no warning",
    },
    {
        "name": "monitor-withdraws-only-the-last-verdict",
        "path": "fastnorm/monitoring/alerts.py",
        "old": (
            "            if d.verdict not in self.alarms:\n                self.alarms.append(d.verdict)\n"
        ),
        "new": "            self.alarms = [d.verdict]\n",
        "tests": [
            "tests/test_monitor.py::test_warnings_follow_new_onsets_and_causes_and_are_withdrawn_together"
        ],
        "what": "the recovered notice names only the last verdict warned of, not every warning it withdraws",
    },
    {
        "name": "families-score-lead-from-before-the-fault",
        "path": "tests/families/score.py",
        "old": '        return next((s for s, v in self.warnings if v != "recovered" and s >= since), None)',
        "new": '        return next((s for s, v in self.warnings if v != "recovered"), None)',
        "tests": ["tests/test_families.py::test_a_warning_before_the_fault_is_a_false_alarm_not_a_lead"],
        "what": "the families scorer counts a warning given before the fault as a warning of it, in time",
    },
    {
        "name": "families-blowup-of-one-batch",
        "path": "tests/families/make_runs.py",
        "old": "            if level(losses, i, i + HOLD) > 10 * before[len(before) // 2]:",
        "new": "            if True:",
        "tests": ["tests/test_families.py::test_the_generator_counts_a_blowup_only_where_it_holds"],
        "what": "the generator's blow-up (and its check that a cause acted) takes one batch 10x its level",
    },
    # ------------------------------------------------------------------
    # The HF Trainer callback (fastnorm/integrations/hf.py)
    # ------------------------------------------------------------------
    {
        "name": "hf-precision-not-told",
        "path": "fastnorm/integrations/hf.py",
        "old": '            precision=_precision(args, kwargs.get("model")),',
        "new": "            precision=None,",
        "tests": [
            "tests/test_stacks_hf.py::test_hf_callback_tells_the_monitor_the_precision_and_the_optimizer"
        ],
        "what": "the monitor is not told the Trainer's precision: an fp32 run may be advised fp32",
    },
    {
        "name": "hf-optimizer-not-told",
        "path": "fastnorm/integrations/hf.py",
        "old": "            self.monitor.optimizer = self._optimizer\n",
        "new": "",
        "tests": [
            "tests/test_stacks_hf.py::test_hf_callback_tells_the_monitor_the_precision_and_the_optimizer"
        ],
        "what": "the monitor never reads the Trainer's optimizer: no weight decay, eps or betas logged",
    },
    {
        "name": "hf-lr-one-step-ahead",
        "path": "fastnorm/integrations/_step_optimizer.py",
        "old": "        if len(self.lrs) != len(groups):\n            return groups\n",
        "new": "        return groups\n",
        "tests": [
            "tests/test_stacks_hf.py::test_hf_callback_tells_the_monitor_the_precision_and_the_optimizer"
        ],
        "what": "the rate logged at a step is the next step's (the scheduler has stepped by then)",
    },
    # ------------------------------------------------------------------
    # StepClipper (fastnorm/optim.py)
    # ------------------------------------------------------------------
    {
        "name": "stepclipper-grad-scale-overflows",
        "path": "fastnorm/optim.py",
        "old": "        return torch.where(unscale, coefficient, divisor)",
        "new": "        return divisor",
        "tests": [
            "tests/test_optim.py::test_a_grad_scaler_near_the_top_of_float32_without_unscale_steps_as_torch_does"
        ],
        "what": "the GradScaler's scale over the clip coefficient overflows float32: the step divides by inf",
    },
    {
        "name": "stepclipper-skips-on-the-scaled-float32-norm",
        "path": "fastnorm/optim.py",
        "old": "                found_inf = _either(self._wide_nonfinite, self._spike)",
        "new": "                found_inf = _either(self._nonfinite, self._spike)",
        "tests": [
            "tests/test_optim.py::test_a_grad_scaler_near_the_top_of_float32_without_unscale_steps_as_torch_does"
        ],
        "what": "finite gradients a GradScaler multiplied are skipped because their float32 norm overflows",
    },
    {
        "name": "stepclipper-grad-scale-drops-eps",
        "path": "fastnorm/optim.py",
        "old": "                grad_scale = torch.clamp_min((norm + 1e-6) / self.max_norm, 1.0)",
        "new": "                grad_scale = torch.clamp_min(norm / self.max_norm, 1.0)",
        "tests": ["tests/test_optim.py::test_the_folded_coefficient_is_torchs_at_small_norms"],
        "what": "the folded clip divides by norm / max_norm, without torch's + 1e-6",
    },
    {
        "name": "stepclipper-found-inf-summed",
        "path": "fastnorm/optim.py",
        "old": "                found_inf = outer if found_inf is None else torch.maximum(found_inf, outer)",
        "new": "                found_inf = outer if found_inf is None else found_inf + outer",
        "tests": ["tests/test_optim.py::test_both_flags_skip_once"],
        "what": "the scaler's and the norm's skip flags are added (2 is not a skip to the kernels)",
    },
    {
        "name": "stepclipper-attributes-outlive-the-step",
        "path": "fastnorm/optim.py",
        "old": '        found_inf = vars(opt).get("found_inf")\n        self._uninstall(opt)\n',
        "new": '        found_inf = vars(opt).get("found_inf")\n',
        "tests": ["tests/test_optim.py::test_attributes_live_only_inside_one_step"],
        "what": "grad_scale and found_inf stay on the optimizer after its step",
    },
    {
        "name": "stepclipper-unfused-default-folds",
        "path": "fastnorm/optim.py",
        "old": 'if not g.get("fused")]',
        "new": 'if g.get("fused") is False]',
        "tests": ["tests/test_optim.py::test_unsupported_optimizers_fall_back_with_one_note"],
        "what": "an optimizer built without fused=True (fused=None) is taken to fold the clip",
    },
    {
        "name": "hint-names-the-other-fastnorm",
        "path": "fastnorm/integrations/hf.py",
        "old": "needs transformers: pip install 'torch-fastnorm[hf]'",
        "new": "needs transformers: pip install 'fastnorm[hf]'",
        "tests": [
            "tests/test_distribution.py::test_every_install_hint_names_this_distribution_never_a_bare_fastnorm"
        ],
        "what": "an install hint names the index's fastnorm, another project",
    },
    {
        "name": "bench-peak-memory-lost-at-each-reset",
        "path": "fastnorm/bench/harness.py",
        "old": '        _PEAK_KIB = max(_PEAK_KIB, _status_kib("VmHWM"))\n',
        "new": "",
        "tests": ["tests/test_bench_verdict.py::test_the_peak_memory_outlives_the_resets_of_the_per_call_measure"],
        "what": "the run's peak memory forgets what came before each per-call measure reset VmHWM",
    },
    {
        "name": "bench-verdict-trusts-a-figure-faster-than-memory",
        "path": "fastnorm/bench/verdict.py",
        "old": "    if not whole and not single:",
        "new": "    if not whole:",
        "tests": ["tests/test_bench_verdict.py"],
        "what": "the verdict calls a run trustworthy although a figure was faster than memory allows",
    },
    {
        "name": "bench-verdict-quotes-disturbed-figures",
        "path": "fastnorm/bench/verdict.py",
        "old": "    return None if r is None or disturbed(record, r) else r",
        "new": "    return r",
        "tests": ["tests/test_bench_verdict.py"],
        "what": "the verdict quotes a disturbed figure as a result",
    },
    # ------------------------------------------------------------------
    # The fastnorm command and the series reader (fastnorm/cli.py, monitoring/series.py, bench/cli.py)
    # ------------------------------------------------------------------
    {
        "name": "cli-errors-escape-as-tracebacks",
        "path": "fastnorm/cli.py",
        "old": "        line = _error_line(error)\n",
        "new": "        raise\n",
        "tests": [
            "tests/test_cli.py::test_an_input_error_or_an_os_error_inside_a_command_is_one_line_and_exit_2",
            "tests/test_cli.py::test_a_defect_shows_its_traceback_and_never_exits_1",
            "tests/test_diagnose_cli.py::test_a_file_that_holds_no_diagnosis_exits_2_with_one_line_naming_it",
        ],
        "what": "an error inside a subcommand is a traceback and exit 1 (the unstable verdict), not one line",
    },
    {
        "name": "cli-closed-stdout-found-at-exit",
        "path": "fastnorm/cli.py",
        "old": "        sys.stdout.flush()  # a reader",
        "new": "        pass  # a reader",
        "tests": ["tests/test_cli.py::test_a_reader_that_closes_stdout_is_one_line_and_exit_2"],
        "what": "a stdout closed by its reader (| head) is found only at the interpreter's exit: a traceback",
    },
    {
        "name": "series-byte-order-mark-kept",
        "path": "fastnorm/monitoring/series.py",
        "old": 'BOM_UTF16_BE) else "utf-8-sig"',
        "new": 'BOM_UTF16_BE) else "utf-8"',
        "tests": ["tests/test_series.py::test_a_byte_order_mark_keeps_the_first_column"],
        "what": "a UTF-8 byte-order mark read as part of the first column's name: the step column is lost",
    },
    {
        "name": "series-event-file-reads-its-folder",
        "path": "fastnorm/monitoring/series.py",
        "old": "        return _read_tensorboard(path, key)",
        "new": "        return _read_tensorboard(path.parent, key)",
        "tests": ["tests/test_series.py::test_an_event_file_is_read_alone_and_its_folder_for_all_its_files"],
        "what": "an event file given by name reads every event file in its folder (another run too)",
    },
    {
        "name": "series-logged-max-norm-unchecked",
        "path": "fastnorm/monitoring/series.py",
        "old": "            max_norm = _max_norm(record[MAX_NORM_KEY], source, step)",
        "new": "            max_norm = float(record[MAX_NORM_KEY])",
        "tests": ["tests/test_series.py::test_a_logged_value_out_of_range_is_an_input_error_naming_the_file"],
        "what": "a logged max_norm of -1, NaN or a list is taken as read, to fail later in the diagnosis",
    },
    {
        "name": "series-step-of-infinity-unchecked",
        "path": "fastnorm/monitoring/series.py",
        "old": "    if not (number and abs(value) < 2**63 and value == int(value)):",
        "new": "    if not number:",
        "tests": ["tests/test_series.py::test_a_logged_value_out_of_range_is_an_input_error_naming_the_file"],
        "what": "a step of Infinity, 1e400 or 2.5 is converted to int (OverflowError, or a step truncated)",
    },
    {
        "name": "bench-out-checked-after-the-run",
        "path": "fastnorm/bench/cli.py",
        "old": '"--out", type=_out_folder, default="bench-results",',
        "new": '"--out", type=Path, default=Path("bench-results"),',
        "tests": ["tests/test_bench.py::test_bad_arguments_are_refused_before_any_workload_runs"],
        "what": "bench --out a file or an unwritable folder is found at its first write, after a workload",
    },
    {
        "name": "diagnosis-ratio-divides-by-zero",
        "path": "fastnorm/monitoring/diagnosis/robust.py",
        "old": "    if bottom == 0:\n        if top == 0 or math.isnan(top):",
        "new": "    if False:\n        if top == 0 or math.isnan(top):",
        "tests": [
            "tests/test_diagnosis_fuzz.py::test_a_blow_up_after_a_learning_rate_frozen_at_zero_is_diagnosed"
        ],
        "what": "a ratio of logged values divides by a learning rate (or loss) of exactly 0 and raises",
    },
    {
        "name": "monitor-failed-diagnosis-keeps-the-last-verdict",
        "path": "fastnorm/monitoring/monitor.py",
        "old": "            self.diagnosis = Diagnosis(FAILED, steps=self.steps_read, error=f\"at step {steps[-1]}, {error}\")\n",
        "new": "",
        "tests": ["tests/test_monitor_robust.py::test_a_failed_diagnosis_never_leaves_a_stale_verdict_and_is_tried_again"],
        "what": "a diagnosis that raised leaves the window before's verdict ('stable') in place",
    },
    {
        "name": "monitor-ctrl-c-in-a-logger-stops-the-hand-over",
        "path": "fastnorm/monitoring/monitor.py",
        "old": "            except BaseException as exc:\n                interrupted = interrupted or exc\n",
        "new": "",
        "tests": ["tests/test_monitor_robust.py::test_a_ctrl_c_in_a_logger_costs_the_other_loggers_nothing"],
        "what": "a KeyboardInterrupt in one logger leaves the loggers after it without the window",
    },
    {
        "name": "monitor-closes-loggers-it-was-told-to-keep",
        "path": "fastnorm/monitoring/monitor.py",
        "old": "logger.close() if self.close_loggers else logger.flush()",
        "new": "logger.close()",
        "tests": [
            "tests/test_monitor_robust.py::test_close_loggers_false_flushes_and_leaves_them_open",
            "tests/test_lightning.py::test_one_callback_logs_a_second_fit_and_a_fit_after_a_failed_one",
        ],
        "what": "a callback's monitor closes the user's loggers: the next train()/fit() logs nothing",
    },
    {
        "name": "patch-takes-a-replacement-for-the-original",
        "path": "fastnorm/integrations/patch.py",
        "old": "        if _is_replacement(original):  # never taken for the original: undoing would put it back\n",
        "new": "        if False:\n",
        "tests": ["tests/test_patch.py::test_a_replacement_is_never_taken_for_the_original"],
        "what": "a replacement found in torch's name is recorded as the original that undo restores",
    },
    {
        "name": "patch-undo-without-the-lock",
        "path": "fastnorm/integrations/patch.py",
        "old": "        with _State.lock:\n            if not self.active:",
        "new": "        if True:\n            if not self.active:",
        "tests": ["tests/test_patch.py::test_patch_and_undo_from_several_threads_leave_torchs_originals"],
        "what": "undo() restores outside the lock: a concurrent patch() takes a replacement for the original",
    },
    {
        "name": "plan-hit-not-rechecked-after-python-code",
        "path": "fastnorm/_eager.py",
        "old": "    if hit is None or not mode or _plan.same_facts(hit.plan, held):",
        "new": "    if True:",
        "tests": ["tests/test_plan_memory.py::test_a_gradient_moved_during_the_call_is_never_read_freed"],
        "what": "a cached plan whose gradient a mode moved during its check is read at the freed address",
    },
    {
        "name": "plan-subclass-gradients-cached",
        "path": "fastnorm/_plan.py",
        "old": "    cacheable = grads.cacheable and not subclassed and all(",
        "new": "    cacheable = grads.cacheable and all(",
        "tests": ["tests/test_plan_memory.py::test_a_gradient_moved_during_the_call_is_never_read_freed"],
        "what": "a plan of subclass gradients is cached: their Python code moves one during the check",
    },
    {
        "name": "lightning-logs-the-next-steps-rate",
        "path": "fastnorm/integrations/lightning.py",
        "old": "            self._optimizer.lrs = rates\n",
        "new": "",
        "tests": ["tests/test_lightning.py::test_the_learning_rate_is_dated_to_the_step_that_used_it"],
        "what": "the rate logged at a step is read after the scheduler stepped: the next step's",
    },
    {
        "name": "patch-monitor-numbers-steps-from-0",
        "path": "fastnorm/integrations/patch.py",
        "old": "        self._steps = 0  # steps handed to the monitor, numbered from 1",
        "new": "        self._steps = -1",
        "tests": ["tests/test_patch.py::test_the_monitor_under_patch_numbers_steps_as_the_trainers_do"],
        "what": "the monitor under patch() numbers steps from 0 while the Trainer logs them from 1",
    },
    {
        "name": "diagnosis-zeros-any-norm-counts-as-zero",
        "path": "fastnorm/monitoring/diagnosis/zeros.py",
        "old": "        if value == 0.0:\n",
        "new": "        if value <= 1.0:\n",
        "tests": ["tests/test_diagnosis_zeros.py"],
        "what": "a small norm counts as an exact zero: nothing trains is said of runs that train",
    },
    {
        "name": "diagnosis-zeros-every-step-needs-a-nonzero",
        "path": "fastnorm/monitoring/diagnosis/zeros.py",
        "old": "        if not self.nonzero:\n",
        "new": "        if self.nonzero and not self.nonzero:\n",
        "tests": ["tests/test_diagnosis_zeros.py"],
        "what": "a norm of exactly 0 at every step is not named: read as a stable norm",
    },
    {
        "name": "diagnosis-zeros-short-run-is-enough",
        "path": "fastnorm/monitoring/diagnosis/zeros.py",
        "old": "        if self.run < need:\n",
        "new": "        if self.run < 1:\n",
        "tests": ["tests/test_diagnosis_zeros.py"],
        "what": "a policy gradient's few tied batches at the end read as nothing training",
    },
    {
        "name": "diagnosis-zeros-precision-known-still-uncertain",
        "path": "fastnorm/monitoring/diagnosis/zeros.py",
        "old": "        if ev.kind is not None:\n",
        "new": "        if ev.kind is None and ev.kind is not None:\n",
        "tests": ["tests/test_diagnosis_zeros.py"],
        "what": "an fp32 run whose gradients became 0 is told to log its precision, which it did",
    },
    {
        "name": "diagnosis-objective-gan-loss-read-as-a-floor",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        if objective in objectives.NOT_A_FLOOR:\n            loss = None",
        "new": "        if objective in ():\n            loss = None",
        "tests": ["tests/test_diagnosis_objective.py"],
        "what": "a generator's rising loss is read as a divergence though its objective is adversarial",
    },
    {
        "name": "diagnosis-objective-negative-loss-not-read",
        "path": "fastnorm/monitoring/diagnosis/objective.py",
        "old": "        if negative >= max(1, NEGATIVE_SHARE * len(losses)):",
        "new": "        if negative > len(losses):",
        "tests": ["tests/test_diagnosis_objective.py"],
        "what": "a loss negative at most of its points is read as a cross-entropy to minimise",
    },
    {
        "name": "diagnosis-objective-fall-needs-1000x",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        if end > start - objectives.FALL_ORDERS:",
        "new": "        if end > start - 3 * objectives.FALL_ORDERS:",
        "tests": ["tests/test_diagnosis_objective.py"],
        "what": "a policy that saturated (its norm 100x down from its start) passes for a stable run",
    },
    {
        "name": "diagnosis-objective-tied-batches-fed-as-zeros",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        if value == 0.0 and self._ties_are_ordinary():",
        "new": "        if value == 0.0 and not self._ties_are_ordinary():",
        "tests": ["tests/test_diagnosis_objective.py"],
        "what": "a policy gradient's tied batches (exact zeros) read as drops of the norm",
    },
    {
        "name": "diagnosis-objective-dpo-rewards-are-rl",
        "path": "fastnorm/monitoring/diagnosis/objective.py",
        "old": "        if words & _PREFERENCE:\n            continue\n",
        "new": "",
        "tests": ["tests/test_diagnosis_objective.py"],
        "what": "a DPO log's rewards/chosen read as a reward: its minimised loss no longer read",
    },
    {
        "name": "diagnosis-stall-blind-log-guesses",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "    if stall.never and blind and not causes:",
        "new": "    if stall.never and blind and causes:",
        "tests": ["tests/test_diagnosis_uncertainty.py"],
        "what": "a stall whose log holds no optimizer setting guesses one cause instead of naming both",
    },
    {
        "name": "optim-clipper-registry-holds-the-optimizer",
        "path": "fastnorm/optim.py",
        "old": "            _CLIPPER_OF[opt] = weakref.ref(self)",
        "new": "            _CLIPPER_OF[opt] = (lambda clipper: lambda: clipper)(self)",
        "tests": ["tests/test_optim.py::test_a_dropped_clipper_lets_its_optimizer_and_parameters_be_collected"],
        "what": "the registry of clippers holds each clipper, so its optimizer and parameters never die",
    },
    {
        "name": "locate-direct-cells-miss-the-head",
        "path": "fastnorm/locate/buffer.py",
        "old": "        self.cells = rows.data_ptr() + 8 * HEAD  # the first event's cells",
        "new": "        self.cells = rows.data_ptr()  # the first event's cells",
        "tests": ["tests/test_locate.py::test_the_buffers_cells_are_the_engines_statistics"],
        "what": "the C++ kernel writes an event's cells three cells early, over the step's head",
    },
    {
        "name": "locate-parameter-read-twice",
        "path": "fastnorm/locate/locator.py",
        "old": "        self._accumulated_in_step.add(index)\n",
        "new": "",
        "tests": ["tests/test_locate.py::test_each_parameters_gradient_is_read_once_a_step_where_backward_wrote_it"],
        "what": "a gradient backward's hook read is read again when the step closes",
    },
    {
        "name": "reward-judged-unscaled-near-the-largest-float",
        "path": "fastnorm/monitoring/diagnosis/objective.py",
        "old": "    scale = _REWARD_SCALE if max(abs(v) for _, v in points) > _REWARD_BIG else 1.0\n",
        "new": "    scale = 1.0\n",
        "tests": [
            "tests/test_diagnosis_objective.py::test_a_reward_near_the_largest_float_is_judged_as_the_same_reward_near_1"
        ],
        "what": "a flat or falling reward near 1.8e308 reads as a rise (inf - inf): no stall, no fall",
    },
    {
        "name": "locate-count-in-one-piece-ignores-the-limit",
        "path": "csrc/kernels.cpp",
        "old": "                      limits[4 * dtype + (limit_code < 0 ? dtype : limit_code)], own, st);",
        "new": "                      limits[4 * dtype + dtype], own, st);",
        "tests": ["tests/test_locate.py::test_the_buffers_cells_are_the_engines_statistics"],
        "what": "the locator's kernel, on a tensor it reads in one piece, judges it by its own dtype's range",
    },
    {
        "name": "locate-record-one-ignores-the-limit",
        "path": "fastnorm/locate/buffer.py",
        "old": "            count(t.data_ptr(), t.numel(), code, _CODES[limit], task, table, cell, threads)",
        "new": "            count(t.data_ptr(), t.numel(), code, code, task, table, cell, threads)",
        "tests": ["tests/test_locate.py::test_the_buffers_cells_are_the_engines_statistics"],
        "what": "an event of one tensor is judged by its own dtype, not by the narrower autocast target",
    },
    {
        "name": "locate-site-cache-ignores-autocast",
        "path": "fastnorm/locate/locator.py",
        "old": (
            "    return torch.get_autocast_dtype(device_type)"
            " if torch.is_autocast_enabled(device_type) else None"
        ),
        "new": "    return None",
        "tests": ["tests/test_locate.py::test_one_locator_judges_each_step_by_its_own_autocast_state"],
        "what": "a module's outputs keep the limit dtype of the first step, under autocast or not",
    },
    {
        "name": "locate-first-offender-is-the-last",
        "path": "fastnorm/locate/buffer.py",
        "old": "        self.rows[CURRENT, :STEP] = keys.amax(0)",
        "new": "        self.rows[CURRENT, :STEP] = keys.amin(0).where(keys.amax(0) > float(\"-inf\"), keys.amax(0))",
        "tests": ["tests/test_locate.py::test_the_first_offender_is_named_on_the_failing_step"],
        "what": "the first offender taken over every event, flagged or not: a step with a finding reports none",
    },
    {
        "name": "locate-remove-keeps-the-hooks",
        "path": "fastnorm/locate/locator.py",
        "old": "        for h in handles:\n            h.remove()\n",
        "new": "        for h in handles[1:]:\n            h.remove()\n",
        "tests": ["tests/test_locate.py::test_remove_restores_every_hook_by_identity"],
        "what": "remove() leaves one of the locator's hooks on the model",
    },
    {
        "name": "guard-skipped-step-enters-the-band",
        "path": "fastnorm/guard.py",
        "old": "            applied = (skipped.detach().reshape(()) == 0) & torch.isfinite(v)",
        "new": "            applied = torch.isfinite(v)",
        "tests": ["tests/test_guard.py"],
        "what": "a step the guard skipped enters its statistics: a spike widens the band it is judged by",
    },
    {
        "name": "guard-flags-during-the-warmup",
        "path": "fastnorm/guard.py",
        "old": "            warm = s[\"count\"] >= self.warmup",
        "new": "            warm = s[\"count\"] >= 2",
        "tests": ["tests/test_guard.py"],
        "what": "the norm rule flags before warmup applied steps are in the window",
    },
    {
        "name": "guard-two-sided-z",
        "path": "fastnorm/guard.py",
        "old": "((v - mean) / std.clamp_min(_MIN_LOG_STD) > self.threshold)",
        "new": "((v - mean).abs() / std.clamp_min(_MIN_LOG_STD) > self.threshold)",
        "tests": ["tests/test_guard.py"],
        "what": "a falling norm is flagged as a spike (the z-score taken both ways)",
    },
    {
        "name": "guard-release-keeps-the-position",
        "path": "fastnorm/guard.py",
        "old": "            s[\"count\"].copy_(torch.where(release, torch.zeros_like(s[\"count\"]), s[\"count\"]))\n",
        "new": "",
        "tests": ["tests/test_guard.py"],
        "what": "a run of release_after flags does not restart the statistics: the guard skips for ever",
    },
    {
        "name": "guard-loss-read-raw-only",
        "path": "fastnorm/guard.py",
        "old": "                z = torch.where(positive, log_z, z)\n",
        "new": "",
        "tests": ["tests/test_guard.py"],
        "what": "a positive loss judged by its value, not its log: a fitting classifier's heavy tail flags",
    },
    {
        "name": "guard-lr-jump-ignored",
        "path": "fastnorm/optim.py",
        "old": "self._lrs() if self.guard.lr_jump is not None else None",
        "new": "None",
        "tests": ["tests/test_guard.py"],
        "what": "StepClipper does not hand the guard the learning rates: a 100x blip is taken",
    },
    {
        "name": "guard-spike-not-in-found-inf",
        "path": "fastnorm/optim.py",
        "old": "                found_inf = _either(self._nonfinite, self._spike)",
        "new": "                found_inf = self._nonfinite",
        "tests": ["tests/test_guard.py"],
        "what": "the spike flag never reaches the fused step: a flagged step is applied",
    },
    {
        "name": "guard-stall-is-not-the-verdict",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        elif stall is not None and verdict != NONFINITE:",
        "new": "        elif stall is not None and verdict == NONFINITE:",
        "tests": ["tests/test_guard.py"],
        "what": "a guard that skips every step to the end is read by the norm alone, not as a stalled run",
    },
    {
        "name": "bench-train-rows-in-the-step-table",
        "path": "fastnorm/bench/report.py",
        "old": "    steps = [rec for rec in run[\"workloads\"] if is_step(rec) and rec not in watched]",
        "new": "    steps = [rec for rec in run[\"workloads\"] if is_step(rec)]",
        "tests": ["tests/test_bench_step.py::test_the_watched_training_step_rows_and_their_table"],
        "what": "the watched training step's rows land in the optimizer step's table, as empty cells",
    },
    {
        "name": "layer-window-max-summed",
        "path": "fastnorm/monitoring/layer_stats.py",
        "old": "    torch.maximum(region[_MAX], s[:, 1], out=region[_MAX])",
        "new": "    torch.add(region[_MAX], s[:, 1], out=region[_MAX])",
        "tests": ["tests/test_layer_stats.py"],
        "what": "the window's largest |g| of a layer is the sum of its steps' maxima",
    },
    {
        "name": "layer-window-last-not-first",
        "path": "fastnorm/monitoring/layer_stats.py",
        "old": "    first.masked_fill_(flags[:, 0] & (first == n), slot)",
        "new": "    first.masked_fill_(flags[:, 0], slot)",
        "tests": ["tests/test_layer_stats.py"],
        "what": "a layer's first non-finite step of the window is its last",
    },
    {
        "name": "layer-window-overflow-steps-from-subnormals",
        "path": "fastnorm/monitoring/layer_stats.py",
        "old": "    flags = s[:, 2::3] > 0  # a non-finite (column 2) or an overflowing (5) value",
        "new": "    flags = s[:, 2::2] > 0",
        "tests": ["tests/test_layer_stats.py"],
        "what": "the steps with an overflow count the steps with a subnormal",
    },
    {
        "name": "layer-window-not-reset",
        "path": "fastnorm/monitoring/monitor.py",
        "old": "            host = self.buffer.tolist()\n            _layer_stats.reset(self.region(), self.n)\n",
        "new": "            host = self.buffer.tolist()\n",
        "tests": ["tests/test_layer_stats.py"],
        "what": "a window's layer statistics carry into the next one",
    },
    {
        "name": "layer-stats-max-abs-summed",
        "path": "fastnorm/layers.py",
        "old": "        stats[:, _stats.MAX_ABS] = 0.0  # the largest of the finite maxima (all >= 0), not their sum\n",
        "new": "",
        "tests": ["tests/test_layer_stats.py"],
        "what": "a layer's largest |g| adds its tensors' maxima before taking the largest",
    },
    {
        "name": "layer-lines-first-is-most-steps",
        "path": "fastnorm/monitoring/diagnosis/events.py",
        "old": "            at = min(firsts.values())",
        "new": "            at = firsts[max(named, key=named.get)]",
        "tests": ["tests/test_layer_stats.py"],
        "what": "the layer named first is the one non-finite on most steps, not the earliest",
    },
    {
        "name": "diag-nan-after-divergence-leads-with-checkpoint",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        cause = led_into(events, verdict, self.sustain * self._ev.interval)\n",
        "new": "        cause = None\n",
        "tests": [
            "tests/test_diagnosis.py::test_a_collapse_to_nan_at_the_end_of_a_divergence_leads_with_the_divergences_actions"
        ],
        "what": "a NaN that ends a divergence leads with 're-run from the checkpoint', not the divergence's cause",
    },
    {
        "name": "diag-early-collapse-not-read",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        if early is not None:\n            events.append(early)\n",
        "new": "",
        "tests": [
            "tests/test_diagnosis.py::test_a_loss_that_rose_into_nan_in_its_first_steps_names_the_rate_and_the_initialisation"
        ],
        "what": "a loss that rose into NaN in its first steps is only a collapse: the rate and the init unnamed",
    },
    {
        "name": "diag-early-collapse-after-a-fall",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "not 0 < 5 * before[0][1] < max(y for _, y in before)",
        "new": "not 0 < before[0][1]",
        "tests": [
            "tests/test_diagnosis.py::test_a_loss_that_rose_into_nan_in_its_first_steps_names_the_rate_and_the_initialisation"
        ],
        "what": "a loss that fell before its first non-finite value is read as blown up from the start",
    },
    {
        "name": "avx2-bounds-miss-a-register",
        "path": "csrc/isa_avx2.h",
        "old": "    for (int r = 0; r < kLanes / kWidth; ++r) {\n      const __m256i a =\n",
        "new": "    for (int r = 0; r + 1 < kLanes / kWidth; ++r) {\n      const __m256i a =\n",
        "tests": ["tests/test_stats.py::test_every_column_matches_the_reference"],
        "what": "the AVX2 bounds skip each block's last register: its largest |x| and zeros go unseen",
        "requires": "avx2",
    },
    {
        "name": "avx2-bf16-way-2-blocks-unbounded",
        "path": "csrc/isa_avx2.h",
        "old": (
            "        add_bf16_words_ahead<Power>(acc, x, i, stop, ahead);\n"
            "        if constexpr (kVisitsBlocks<Visit>) visit.block(x + i * kLanes);\n      }\n      mxcsr_fence(acc);\n"
            "      _mm_setcsr(clear);"
        ),
        "new": (
            "        add_bf16_words_ahead<Power>(acc, x, i, stop, ahead);\n      }\n      mxcsr_fence(acc);\n"
            "      _mm_setcsr(clear);"
        ),
        "tests": ["tests/test_stats.py::test_cpp_counts_see_every_stretch_of_the_fused_pass_once"],
        "what": "the bfloat16 word loop's careful way (after a subnormal) leaves its blocks out of the bounds",
        "requires": "avx2",
    },
    {
        "name": "avx2-bf16-last-chunk-unstretched",
        "path": "csrc/isa_avx2.h",
        "old": "      visit.stretch(x + counted, blocks * kLanes - counted);\n      counted = blocks * kLanes;\n",
        "new": "      counted = blocks * kLanes;\n",
        "tests": ["tests/test_stats.py::test_cpp_counts_see_every_stretch_of_the_fused_pass_once"],
        "what": "the bfloat16 word loop never counts its last chunk's zeros and values below the normal range",
        "requires": "avx2",
    },
    {
        "name": "hf-measure-forgets-the-pending-step",
        "path": "fastnorm/integrations/hf.py",
        "old": "        self._record()  # the step before's, whose logs have passed: `due` counts it\n",
        "new": "",
        "tests": ["tests/test_stacks_hf.py::test_hf_callback_per_layer_norms_come_from_the_steps_own_pass"],
        "what": "the HF callback asks `due` with the step before still pending: the layers miss the window's end",
    },
    {
        "name": "hf-take-drops-the-measured-norm",
        "path": "fastnorm/integrations/hf.py",
        "old": "            return (measured[0] if norm is None else norm, measured[1], measured[2])\n",
        "new": "            return None if norm is None else (norm, measured[1], measured[2])\n",
        "tests": ["tests/test_stacks_hf.py::test_hf_callback_logs_every_steps_norm_without_clipping"],
        "what": "a step whose norm only get_total_norm computed (no clipping, accelerate 1.16) is not logged",
    },
    {
        "name": "hf-measure-takes-any-gradients",
        "path": "fastnorm/integrations/hf.py",
        "old": "        if len(present) != len(mine) or any(id(g) not in mine for g in present):\n",
        "new": "        if False:\n",
        "tests": ["tests/test_stacks_hf.py::test_hf_callback_per_layer_leaves_dtensor_gradients_to_the_trainers_path"],
        "what": "one mesh's get_total_norm answered with the whole model's norm: the Trainer clips by a wrong total",
    },
    {
        "name": "hf-measure-takes-dtensor-gradients",
        "path": "fastnorm/integrations/hf.py",
        "old": "        if any(distributed.is_dtensor(g) for g in present):\n",
        "new": "        if False:\n",
        "tests": ["tests/test_stacks_hf.py::test_hf_callback_per_layer_leaves_dtensor_gradients_to_the_trainers_path"],
        "what": "the main process measures DTensor gradients itself: a collective the other processes never run",
    },
    {
        "name": "patch-get-total-norm-never-asks-the-monitor",
        "path": "fastnorm/integrations/patch.py",
        "old": "    tensors, measured = _measured(tensors, norm_type, error_if_nonfinite, gradients=True)\n",
        "new": "    measured = None\n",
        "tests": ["tests/test_stacks_hf.py::test_hf_callback_layer_stats_name_the_module_that_went_non_finite_first"],
        "what": "get_total_norm computes the norm without the callback: no layer statistics before the clip",
    },
    {
        "name": "patch-clip-grad-norm-never-asks-the-monitor",
        "path": "fastnorm/integrations/patch.py",
        "old": "    parameters, measured = _measured(parameters, norm_type, error_if_nonfinite, gradients=False)\n",
        "new": "    measured = None\n",
        "tests": ["tests/test_patch.py::test_a_measuring_monitor_is_asked_first_and_its_norm_is_used_as_is"],
        "what": "clip_grad_norm_ never asks a measuring monitor: its per-layer statistics are lost",
    },
    {
        "name": "stats-rows-always-in-order",
        "path": "fastnorm/_eager.py",
        "old": "        plan.in_order = (\n            len(groups) == 1\n",
        "new": "        plan.in_order = True or (\n            len(groups) == 1\n",
        "tests": ["tests/test_stats.py"],
        "what": "tensor_stats hands the backend's rows on as the items' where some item has no gradient or another group",
    },
    {
        "name": "stats-limits-taken-for-none",
        "path": "fastnorm/_eager.py",
        "old": "    if limits.count(None) == len(limits):\n        return rows  # no limit given",
        "new": "    if True:\n        return rows  # no limit given",
        "tests": ["tests/test_stats.py"],
        "what": "tensor_stats drops the limit dtypes given: every tensor counted against its own dtype",
    },
    {
        "name": "diag-reward-stall-reads-a-median",
        "path": "fastnorm/monitoring/diagnosis/objective.py",
        "old": "    first, last = _trimmed_mean(head), _trimmed_mean(tail)",
        "new": "    first, last = median(sorted(head)), median(sorted(tail))",
        "tests": [
            "tests/test_diagnosis_objective.py::"
            "test_a_reward_that_never_rose_is_a_stall_and_one_that_fell_a_divergence"
        ],
        "what": "a reward of a few discrete scores is read by its medians, which move a whole score at a time",
    },
    {
        "name": "diag-reward-not-read-from-the-log",
        "path": "fastnorm/monitoring/series.py",
        "old": "        \"reward\": _first(REWARD_KEYS, present),\n",
        "new": "",
        "tests": [
            "tests/test_diagnosis_objective.py::"
            "test_the_reward_is_read_from_a_trainer_state_and_reaches_the_report"
        ],
        "what": "a log's reward is never read: a GRPO run whose reward never rose is stable",
    },
    {
        "name": "monitor-reward-read-from-the-loss-row",
        "path": "fastnorm/monitoring/monitor.py",
        "old": "        rewards = tuple(host[_REWARD * n + i] if given",
        "new": "        rewards = tuple(host[_LOSS * n + i] if given",
        "tests": [
            "tests/test_diagnosis_objective.py::test_a_monitor_given_the_reward_logs_it_and_judges_it_online"
        ],
        "what": "the monitor logs and judges each step's loss as its reward",
    },
    {
        "name": "diag-reward-tie-drop-sends-to-the-batch",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        if f.side < 0 and self._ties_are_ordinary():",
        "new": "        if False:",
        "tests": [
            "tests/test_diagnosis_objective.py::"
            "test_a_reward_driven_runs_short_drops_are_tied_batches_not_batches_to_check"
        ],
        "what": "a reward-driven run's drop at a batch whose rewards tied asks to check that batch",
    },
    {
        "name": "diag-unlogged-plateau-guesses-warmup",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "    return (cut, warm) if norm_steady else (warm, cut)\n",
        "new": "    return (warm, cut)\n",
        "tests": [
            "tests/test_diagnosis.py::test_a_plateau_without_the_learning_rate_logged_names_both_causes_and_claims_no_rate"
        ],
        "what": "a plateau in a log without the rate leads with a warmup, as if the rate were known constant",
    },
    {
        "name": "diagnosis-a-loss-made-worse-from-its-first-point-is-a-rate-too-low",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "        return (self.steps[0], ys[0], later) if later >= 1.5 * ys[0] else None\n",
        "new": "        return None\n",
        "tests": [
            "tests/test_diagnosis_uncertainty.py::"
            "test_a_loss_the_updates_made_worse_from_its_first_point_is_a_rate_too_high_not_too_low"
        ],
        "what": "a loss the updates made worse from its first point is told to raise the learning rate",
    },
    {
        "name": "diagnosis-an-unlogged-plateau-goes-unsaid",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "        plateau = loss.plateau(deep=True)\n        if plateau is None or self._lr.first is not None:\n",
        "new": "        plateau = None\n        if plateau is None or self._lr.first is not None:\n",
        "tests": [
            "tests/test_diagnosis_uncertainty.py::"
            "test_a_loss_flat_after_an_early_fall_in_a_log_without_the_rate_is_said_not_judged"
        ],
        "what": "a loss flat after an early fall in a log without the rate reads as plain stable, unsaid",
    },
    {
        "name": "cpp-zen5-reads-without-prefetch",
        "path": "csrc/kernels.cpp",
        "old": "  if (vendor == \"amd\" && family >= 26) return 4096;\n",
        "new": "",
        "tests": ["tests/test_cpu_kernels.py::test_the_default_prefetch_distance_follows_the_vendor"],
        "what": "AMD Zen 5 (family 26) gets Zen 4's distance, none: its loops read 3-13% slower",
    },
    {
        "name": "diagnosis-a-slow-fall-after-an-early-one-is-a-plateau",
        "path": "fastnorm/monitoring/diagnosis/loss.py",
        "old": "        if -change >= self.stall_fraction * abs(earlier) and errors <= -TREND_ERRORS:\n",
        "new": "        if False:\n",
        "tests": [
            "tests/test_diagnosis.py::"
            "test_a_loss_still_falling_slowly_after_an_early_fall_is_learning_not_a_plateau"
        ],
        "what": "a loss still falling 8% along its line after an early fall reads as a plateau: a stall",
    },
    {
        "name": "diagnosis-a-trend-counts-correlated-points-as-independent",
        "path": "fastnorm/monitoring/diagnosis/robust.py",
        "old": "    worth = max(3.0, n * (1 - r1) / (1 + r1))\n",
        "new": "    worth = float(n)\n",
        "tests": ["tests/test_diagnosis.py::test_a_trend_is_its_change_over_the_span_in_standard_errors"],
        "what": "a trend through correlated noise is read as if every point were independent evidence",
    },
    {
        "name": "diagnosis-a-noisy-norms-shift-warns-of-nothing",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "            found += self._climbing(last) or self._shifted(last)\n",
        "new": "            found += self._climbing(last)\n",
        "tests": [
            "tests/test_diagnosis_early.py::"
            "test_a_noisy_norm_lifted_inside_its_band_warns_as_the_loss_turns"
        ],
        "what": "a noisy norm lifted 2.5x inside its band, the loss turning, warns of nothing",
    },
    {
        "name": "diagnosis-a-shift-whose-last-point-left-the-band-warns-of-nothing",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "            if self._dep.side > 0 and not self._dep.held(self.sustain):  # too young: the shift before it\n",
        "new": "            if False:\n",
        "tests": [
            "tests/test_diagnosis_early.py::"
            "test_a_noisy_norm_lifted_inside_its_band_warns_as_the_loss_turns"
        ],
        "what": "a shift whose last point just left the band warns of nothing: the departure hides it",
    },
    {
        "name": "diagnosis-a-fall-out-of-the-band-reads-as-a-rise",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "            if self._dep.side > 0 and not self._dep.held(self.sustain):  # too young: the shift before it\n",
        "new": "            if not self._dep.held(self.sustain):\n",
        "tests": ["tests/test_diagnosis_early.py::test_a_shift_reads_no_fall_and_no_window_shorter_than_its_points"],
        "what": "a norm that rose in its band, then fell out of it at the last step, reads as still rising",
    },
    {
        "name": "diagnosis-a-warmups-peak-is-not-the-largest-rate",
        "path": "fastnorm/monitoring/diagnosis/schedule.py",
        "old": "        self.top = abs(value) if self.top is None else max(self.top, abs(value))\n",
        "new": "        self.top = abs(value) if self.top is None else self.top\n",
        "tests": ["tests/test_diagnosis.py::test_an_adam_rate_too_small_to_move_a_weight_leads_with_raising_it"],
        "what": "a warmup from 0 to 1e-3 reads as a rate of 0 that moves no weight: raise_lr leads",
    },
    {
        "name": "diagnosis-a-shift-that-fell-back-still-warns",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "        if now - before < max(CLIMB_ORDERS, errors) or now <= previous:\n",
        "new": "        if now - before < max(CLIMB_ORDERS, errors):\n",
        "tests": [
            "tests/test_diagnosis_early.py::"
            "test_a_noisy_norm_lifted_inside_its_band_warns_as_the_loss_turns"
        ],
        "what": "a norm lifted and already falling back warns as if still rising",
    },
    {
        "name": "diagnosis-a-still-adam-rate-goes-unnamed",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "    if top * steps >= ADAM_STILL:\n",
        "new": "    if True:\n",
        "tests": [
            "tests/test_diagnosis.py::test_an_adam_rate_too_small_to_move_a_weight_leads_with_raising_it"
        ],
        "what": "an Adam rate of 2e-8 over 600 steps, which moves no weight, is not named: the labels lead",
    },
    {
        "name": "diagnosis-a-chance-loss-without-the-rate-names-only-the-labels",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "        blind = stall.never and ev.lr_first is None\n",
        "new": "        blind = False\n",
        "tests": [
            "tests/test_diagnosis.py::"
            "test_a_loss_at_chance_in_a_log_without_the_rate_names_a_rate_too_low_as_well"
        ],
        "what": "a loss at chance in a log without the rate blames the labels alone, as if it were known",
    },
    {
        "name": "diagnosis-a-cant-tell-names-one-cause",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "        action.candidates = (id,) if unless is None else (id, unless)\n",
        "new": "        action.candidates = (id,)\n",
        "tests": [
            "tests/test_diagnosis_uncertainty.py::"
            "test_an_action_that_cannot_tell_two_causes_apart_names_both_in_its_candidates"
        ],
        "what": "an action that says the log cannot tell two causes apart names only the one it puts first",
    },
    {
        "name": "diagnosis-an-action-takes-any-id",
        "path": "fastnorm/monitoring/diagnosis/advice.py",
        "old": "        if id not in IDS:\n",
        "new": "        if False:\n",
        "tests": [
            "tests/test_diagnosis_uncertainty.py::"
            "test_an_action_id_outside_the_documented_ones_is_refused_by_name"
        ],
        "what": "an action's id outside the documented ones (advice.IDS) goes unrefused",
    },
    {
        "name": "diagnosis-a-climbing-baseline-warns-of-nothing",
        "path": "fastnorm/monitoring/diagnosis/norm.py",
        "old": "        if high - low < CLIMB_ORDERS or high < max(b for _, b in climb):\n",
        "new": "        if True:\n",
        "tests": [
            "tests/test_diagnosis_early.py::"
            "test_a_baseline_climbing_as_the_loss_turns_warns_before_the_loss_blows_up"
        ],
        "what": "a norm whose baseline climbs inside its band warns only once the loss has blown up",
    },
    {
        "name": "diagnosis-a-climb-warns-whatever-the-loss-does",
        "path": "fastnorm/monitoring/diagnosis/diagnoser.py",
        "old": "            found = [f for f in found if not f.climbing or now > loss.at(f.event.start_step)]\n",
        "new": "            found = found\n",
        "tests": [
            "tests/test_diagnosis_early.py::"
            "test_a_climb_the_loss_does_not_follow_or_an_objective_without_a_floor_warns_of_nothing"
        ],
        "what": "a climbing norm warns while the loss still holds (a model whose logits sharpen)",
    },
    {
        "name": "cpp-the-count-loop-prefetches-nothing",
        "path": "csrc/isa_avx2.h",
        "old": "    if (i + 2 * kWidth <= stop) prefetch_ahead<2 * kWidth * int(sizeof(S))>(x + i, ahead);\n",
        "new": "\n",
        "tests": ["tests/test_cpu_codegen.py::test_the_count_loops_ask_for_their_lines_ahead"],
        "what": "the AVX2 count loop reads its tensors from memory without asking for their lines ahead",
    },
]
