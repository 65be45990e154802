"""bench/run.py's command line: defaults, --quick, and what it refuses."""
import contextlib
import io
import re
import sys
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import run  # noqa: E402
from sagabench import options  # noqa: E402
from sagabench import runs  # noqa: E402
from sagabench.options import UsageError, parse  # noqa: E402
from sagabench.results import Results  # noqa: E402


class WorkerBatch(unittest.TestCase):
    def test_floor_batches_are_the_workers_default_and_limit(self):
        root = Path(__file__).resolve().parents[2]
        header = (root / "workers" / "include" / "sagapool" / "worker.hpp").read_text()
        cli = (root / "workers" / "src" / "main.cpp").read_text()
        self.assertEqual(int(re.search(r"batch_size = (\d+);", header).group(1)), options.WORKER_BATCH)
        limit = re.search(r'"--batch-size".*?CLI::Range\(1, (\d+)\)', cli, re.S).group(1)
        self.assertEqual(int(limit), options.FLOOR_BATCH_MAX)
        sqlite_default = re.search(r"one_writer\) o\.batch_size = (\d+);", cli).group(1)
        self.assertEqual(int(sqlite_default), options.FLOOR_BATCH_MAX)

    def test_the_postgresql_floor_batch_is_a_lanes_share(self):
        cli = (Path(__file__).resolve().parents[2] / "workers" / "src" / "main.cpp").read_text()
        lanes = int(re.search(r"store_lanes = lanes_possible \? (\d+) : 1;", cli).group(1))
        self.assertEqual(lanes, options.PG_LANES)
        self.assertEqual(options.PG_FLOOR_BATCH, options.WORKER_BATCH // lanes)


class Defaults(unittest.TestCase):
    def test_full_run(self):
        o = parse([], {})
        self.assertEqual((o.quick, o.reps, o.transfers, o.workers), (False, 3, None, 2))
        self.assertEqual(o.clients, (2, 4, 8, 16, 32, 64))
        self.assertEqual((o.scale_store, o.out, o.keep), ("sqlite", None, False))
        self.assertEqual((o.probe_s, o.pgbench_s, o.half_s, o.warmup_n), (2, 8, 20, 2000))
        self.assertEqual(o.budget_s, 5400)

    def test_quick_shrinks_sizes(self):
        o = parse(["--quick"], {})
        self.assertEqual((o.reps, o.transfers, o.clients), (1, 5000, (4, 16)))
        self.assertEqual((o.probe_s, o.pgbench_s, o.half_s, o.warmup_n, o.budget_s), (1, 2, 4, 1000, 300))

    def test_explicit_flags_win_over_quick_in_any_order(self):
        o = parse(["--reps", "2", "--quick", "--transfers", "700", "--clients", "1 8"], {})
        self.assertEqual((o.reps, o.transfers, o.clients), (2, 700, (1, 8)))

    def test_values(self):
        o = parse(["--workers", "4", "--scale-store", "postgres", "--out", "r", "--keep"], {})
        self.assertEqual((o.workers, o.scale_store, o.out, o.keep), (4, "postgres", "r", True))
        self.assertEqual((o.scale_name, o.clients_text), ("PostgreSQL", "2 4 8 16 32 64"))

    def test_args_kept_for_the_report(self):
        self.assertEqual(parse(["--quick", "--reps", "2"], {}).args, ("--quick", "--reps", "2"))


class RunSize(unittest.TestCase):
    def test_seconds_of_work_in_whole_thousands_within_the_bounds(self):
        self.assertEqual(options.run_size(10335.5), 775000)  # 75 s at the rate
        self.assertEqual(options.run_size(100), options.TRANSFERS_MIN)
        self.assertEqual(options.run_size(50000), options.TRANSFERS_MAX)

    def test_sustained_runs_sized_from_the_saga_broker_runs_when_faster(self):
        bench = runs.Bench.__new__(runs.Bench)  # no session: only the sizing is used
        bench.opts = parse([], {})
        bench.results = Results()
        bench.run_n = {"postgres": 339000, "sqlite": 1000000}
        for rep, tput in enumerate((4159, 10000, 11033), 1):
            bench.results.add("c-uniform", rep, tput, 1, 1, "0.1", 1, "-", "-")
        bench.results.add("c-zipf", 1, 10671, 1, 1, "0.1", 1, "-", "-")
        bench.results.add("d-uniform", 1, 100, 1, 1, "0.1", 1, "-", "-")  # slower than the calibration
        with contextlib.redirect_stdout(io.StringIO()):
            bench.size_sustained_runs()
        self.assertEqual(bench.run_n, {"postgres": 750000, "sqlite": 1000000})  # the lower middle: 10,000/s
        bench.opts = parse(["--transfers", "5000"], {})
        bench.run_n = {"postgres": 5000, "sqlite": 5000}
        bench.size_sustained_runs()
        self.assertEqual(bench.run_n, {"postgres": 5000, "sqlite": 5000})


class Budget(unittest.TestCase):
    def test_env_overrides_both_defaults(self):
        self.assertEqual(parse([], {"SAGA_BENCH_BUDGET_S": "100"}).budget_s, 100)
        self.assertEqual(parse(["--quick"], {"SAGA_BENCH_BUDGET_S": "60"}).budget_s, 60)

    def test_empty_counts_as_unset(self):
        self.assertEqual(parse([], {"SAGA_BENCH_BUDGET_S": ""}).budget_s, options.BUDGET_S)

    def test_not_a_number(self):
        with self.assertRaisesRegex(UsageError, "SAGA_BENCH_BUDGET_S"):
            parse([], {"SAGA_BENCH_BUDGET_S": "13m"})


class Refused(unittest.TestCase):
    def refused(self, argv, message):
        with self.assertRaises(UsageError) as caught:
            parse(argv, {})
        self.assertEqual(str(caught.exception), message)

    def test_unknown_option(self):
        self.refused(["--fast"], "unknown option --fast")

    def test_missing_value(self):
        self.refused(["--reps"], "--reps needs a value")

    def test_scale_store(self):
        self.refused(["--scale-store", "memory"], "--scale-store takes sqlite or postgres")

    def test_positive_integers(self):
        for flag in ("--reps", "--workers", "--transfers"):
            for bad in ("0", "-1", "x", "1.5", "01"):
                self.refused([flag, bad], f"{flag} takes a positive integer")

    def test_clients(self):
        for bad in ("", "4 x", "0 4"):
            self.refused(["--clients", bad], '--clients takes positive integers, as in "1 2 4"')


class EntryPoint(unittest.TestCase):
    """run.main's exits before it starts anything."""

    def main(self, argv):
        err, out = io.StringIO(), io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            code = run.main(argv)
        return code, out.getvalue(), err.getvalue()

    def test_no_argument_prints_usage_and_exits_2(self):
        code, _, err = self.main([])
        self.assertEqual(code, 2)
        self.assertIn("Usage: bench/run.py BIN_DIR [--quick]", err)

    def test_help(self):
        code, out, _ = self.main(["--help"])
        self.assertEqual(code, 0)
        self.assertIn("--scale-store sqlite|postgres", out)

    def test_bad_flag_exits_2_with_message(self):
        code, _, err = self.main([".", "--bogus"])
        self.assertEqual((code, err), (2, "bench: unknown option --bogus\n"))

    def test_bin_dir_without_programs(self):
        code, _, err = self.main([str(Path(__file__).parent)])
        self.assertEqual(code, 2)
        self.assertIn("no saga-worker", err)


class HalfLoad(unittest.TestCase):
    def test_saga_broker_runs_stop_at_its_retention_and_real_kafka_runs_do_not(self):
        self.assertEqual(options.half_load_n(30_000, 20, "mock"), 600_000)
        self.assertEqual(options.half_load_n(50_744, 20, "mock"), options.MOCK_HALF_LOAD_MAX)
        self.assertEqual(options.half_load_n(50_744, 20, "kafka"), 1_014_880)
        self.assertEqual(options.half_load_n(10, 20, "mock"), 1000)


if __name__ == "__main__":
    unittest.main()
