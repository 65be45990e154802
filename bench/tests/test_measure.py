"""Figures from raw text: medians, percentiles, /proc, pgbench, dd, a run."""
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sagabench import measure  # noqa: E402
from sagabench.machine import mount_type  # noqa: E402

# /proc/PID/stat: utime 100, stime 20, cutime 3, cstime 4 (fields 14..17)
STAT = "{pid} ({comm}) S {ppid} 40 40 0 -1 4194560 500 0 0 0 100 20 3 4 20 0 1 0 100 1000 10 0"


def stat(pid, ppid, comm="postgres"):
    return STAT.format(pid=pid, ppid=ppid, comm=comm)


class Median(unittest.TestCase):
    def test_odd_count(self):
        self.assertEqual(measure.median([3, 1, 2]), 2)

    def test_even_count_takes_the_lower_middle(self):
        self.assertEqual(measure.median([4, 1, 3, 2]), 2)

    def test_numeric_order_of_text_kept_as_given(self):
        self.assertEqual(measure.median(["900", "10000", "1000.5"]), "1000.5")

    def test_empty(self):
        self.assertIsNone(measure.median([]))


class Pick(unittest.TestCase):
    def test_like_sql_offset(self):
        values = list(range(1, 201))  # OFFSET 200 * 99 / 100 = 198
        self.assertEqual(measure.pick(values, 50), 101)
        self.assertEqual(measure.pick(values, 99), 199)

    def test_one_value(self):
        self.assertEqual((measure.pick([7], 50), measure.pick([7], 99)), (7, 7))


class FinishedTotal(unittest.TestCase):
    def test_sums_every_label_set_and_nothing_else(self):
        text = """# HELP saga_transfers_finished_total Transfers that reached a terminal state.
# TYPE saga_transfers_finished_total counter
saga_transfers_finished_total{outcome="done",reason="none"} 1200
saga_transfers_finished_total{outcome="canceled",reason="insufficient_funds"} 3.4e+01
saga_transfers_finished_totals 7
saga_requests_total{result="accepted"} 5000
"""
        self.assertEqual(measure.finished_total(text), 1234)

    def test_none_yet(self):
        self.assertEqual(measure.finished_total("saga_requests_total 0\n"), 0)


class ProcStat(unittest.TestCase):
    def test_ticks_are_user_system_and_reaped_children(self):
        self.assertEqual(measure.stat_ticks(stat(42, 1)), (42, 1, 127))

    def test_command_name_with_spaces_and_parentheses(self):
        self.assertEqual(measure.stat_ticks(stat(7, 3, comm="a) b (c) d")), (7, 3, 127))

    def test_tree_is_the_root_and_its_children(self):
        stats = [stat(10, 1), stat(11, 10), stat(12, 10), stat(13, 11), stat(14, 1)]
        self.assertEqual(measure.tree_ticks(stats, 10), 3 * 127)

    def test_vm_hwm(self):
        status = "Name:\tsaga-worker\nVmPeak:\t  900 kB\nVmHWM:\t   51234 kB\nVmRSS:\t 4000 kB\n"
        self.assertEqual(measure.vm_hwm_kb(status), 51234)
        self.assertEqual(measure.vm_hwm_kb(""), 0)

    def test_machine_busy_leaves_out_idle_and_iowait(self):
        text = ("cpu  100 2 30 5000 400 6 7 8 50 0\n"  # user nice system idle iowait irq softirq steal guest
                "cpu0 50 1 15 2500 200 3 4 4 25 0\nintr 123\n")
        self.assertEqual(measure.busy_ticks(text), 100 + 2 + 30 + 6 + 7 + 8)
        self.assertGreater(measure.machine_busy_ticks(), 0)
        self.assertRegex(str(measure.BusyCores()), r"^\d+\.\d\d$")

    def test_live_process(self):
        import os
        self.assertGreaterEqual(measure.proc_ticks(os.getpid()), 0)
        self.assertGreater(measure.proc_hwm_kb(os.getpid()), 0)
        self.assertEqual(measure.proc_ticks(2 ** 22 + 1), 0)  # no such process


class Pgbench(unittest.TestCase):
    OUT = """transaction type: bench/plain_transfer.sql
number of clients: 16
number of transactions actually processed: 16589
number of failed transactions: 0 (0.000%)
latency average = 1.928 ms
initial connection time = 21.412 ms
tps = 8294.512345 (without initial connection time)
"""

    def test_result(self):
        self.assertEqual(measure.pgbench_result(self.OUT), (8294.512345, 16589))

    def test_no_result(self):
        self.assertIsNone(measure.pgbench_result("pgbench: error: connection refused\n"))
        self.assertIsNone(measure.pgbench_result(self.OUT.replace("16589", "0")))

    def test_latencies_from_logs(self):
        with tempfile.TemporaryDirectory() as d:
            a, b = Path(d) / "tx.1", Path(d) / "tx.1.1"
            a.write_text("".join(f"0 {i} {i * 100} 0 1700000000 {i}\n" for i in range(1, 101)))
            b.write_text("1 0 25000 0 1700000000 0\n\n")
            # 101 latencies: 0.1 .. 10 ms and one of 25 ms
            self.assertEqual(measure.pgbench_latencies([a, b]), ("5.1", "10.0"))
            self.assertEqual(measure.pgbench_latencies([]), ("NaN", "NaN"))

    def test_floor_cpu_counts_each_server_over_its_own_transactions(self):
        # one server: 100 transactions of 2,500 in 5 s of CPU
        self.assertAlmostEqual(measure.floor_cpu_per_1k([(100, 5.0)], 2500), 0.02)
        # two servers, one 1.5 x ahead: 0.02 + 0.02, not 12.5 s over the slower one's 100 (0.05)
        self.assertAlmostEqual(measure.floor_cpu_per_1k([(100, 5.0), (150, 7.5)], 2500), 0.04)

    def test_dd(self):
        report = "300+0 records in\n300+0 records out\n2457600 bytes (2.5 MB, 2.3 MiB) copied, 0.0512 s, 48.0 MB/s\n"
        self.assertEqual(measure.dd_seconds(report), 0.0512)
        self.assertIsNone(measure.dd_seconds("dd: failed to open"))


class RunFigures(unittest.TestCase):
    def test_figures(self):
        # the producer's lone first request, then 10 transfers requested 1 s
        # apart, each taking 100 + 10 i ms; one canceled
        rows = [(1000 * i, 1000 * i + 100 + 10 * i, i != 3) for i in range(10)] + [(-1500, 40, True)]
        f = measure.run_figures(rows, steady_after_ms=2000)
        # done counts every transfer of the run, the first request too
        self.assertEqual((f.seen, f.done, f.span_ms), (10, 10, 9190))
        self.assertEqual((f.p50, f.p99), (150, 190))
        self.assertEqual((f.steady_p50, f.steady_p99), (160, 190))  # 8 from t = 2 s
        self.assertEqual(f.transfers_per_s, "1")

    def test_the_first_request_is_not_the_spans_start(self):
        # a fresh client's first request waited a second for its delivery;
        # the burst after it finished in 1 s
        rows = [(0, 1200, True)] + [(1000 + i, 2000, True) for i in range(1000)]
        f = measure.run_figures(rows, steady_after_ms=2000)
        self.assertEqual((f.seen, f.span_ms, f.transfers_per_s), (1000, 1000, "1000"))

    def test_sustained_is_the_last_thirds_rate_over_the_firsts(self):
        # span 0..9000 ms: 6 finish by 3000, 3 after 6000
        fins = [500, 1000, 1500, 2000, 2500, 3000, 4000, 7000, 8000, 9000]
        f = measure.run_figures([(-1, 1, True)] + [(0, fin, True) for fin in fins], steady_after_ms=2000)
        self.assertEqual((f.first_third, f.last_third, f.sustained), (6, 3, "0.50"))

    def test_all_in_the_first_seconds(self):
        f = measure.run_figures([(-100, 1, True), (0, 5, True), (10, 30, True)], steady_after_ms=2000)
        self.assertIsNone(f.steady_p50)
        self.assertEqual(f.transfers_per_s, "67")

    def test_one_transfer(self):
        f = measure.run_figures([(0, 50, True)], steady_after_ms=2000)
        self.assertEqual((f.seen, f.span_ms), (1, 50))


class Mounts(unittest.TestCase):
    MOUNTS = "rootfs / ext4 rw 0 0\ntmpfs /srv tmpfs rw 0 0\n/dev/x /srv/my\\040disk xfs rw 0 0\n"

    def test_longest_mount_point_above(self):
        self.assertEqual(mount_type(self.MOUNTS, "/srv/sagapool-bench-1"), "tmpfs")
        self.assertEqual(mount_type(self.MOUNTS, "/srv/my disk/b"), "xfs")
        self.assertEqual(mount_type(self.MOUNTS, "/srvx"), "ext4")


if __name__ == "__main__":
    unittest.main()
