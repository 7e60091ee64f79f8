"""Unit tests of nccl_e2e.py's logic that needs no GPU: size ladders, nccl-tests
bus-bandwidth factors, NCCL version handling, plugin environment, rank
environment, the log checks (on log excerpts in the formats NCCL 2.20 to 2.30
print) and the "cannot run here" exit path.

Run: python3 -m unittest discover -s e2e -p 'test_*.py'
"""

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nccl_e2e as e  # noqa: E402

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "nccl_e2e.py")


def nccl_log(*msgs, host="gpu1", pid=4242):
    """Lines the way NCCL prints them: host:pid:tid [cudaDev] NCCL INFO|WARN msg."""
    out = []
    for m in msgs:
        level, _, text = m.partition(" ") if m.startswith(("INFO ", "WARN ")) else ("INFO", "", m)
        out.append(f"{host}:{pid}:{pid + 7} [0] NCCL {level} {text}")
    return "\n".join(out) + "\n"


GO_INIT_V10 = "NET/Go : libnccl-net-go 0.1.0, NCCL net API v10, transport socket, 1 device(s): lo (127.0.0.1, 100 Gb/s)"
CHANNELS_GO = ["Channel 00/0 : 0[0] -> 1[0] [send] via NET/Go/0",
               "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Go/0",
               "Channel 01/0 : 0[0] -> 1[0] [send] via NET/Go/0/GDRDMA"]

# NCCL 2.27: full path accepted, plugin_open.cc and net_v10.cc messages.
LOG_2_27 = nccl_log(
    "NCCL version 2.27.5+cuda12.9",
    "NET/Plugin: Plugin name set by env to /opt/e2e/libnccl-net-go.so",
    "NET/Plugin: Loaded net plugin Go (v10)",
    "NET/Plugin: Failed to find ncclCollNetPlugin_v10 symbol.",
    "Successfully loaded external plugin /opt/e2e/libnccl-net-go.so",
    GO_INIT_V10,
    "Using network Go",
    *CHANNELS_GO)

# NCCL 2.20: only libnccl-net-<name>.so is tried, message without NET/ prefix.
LOG_2_20 = nccl_log(
    "Plugin name set by env to libnccl-net-go.so",
    "NET/Plugin: Loaded net plugin Go (v8)",
    GO_INIT_V10.replace("v10", "v8"),
    "Using network Go",
    *CHANNELS_GO)

# Our init line and channel lines without any NCCL loader line: not accepted,
# NCCL itself must say it loaded our library (see check_log).
LOG_NO_NCCL_PLUGIN_LINES = nccl_log(GO_INIT_V10, *CHANNELS_GO)

LOG_SOCKET = nccl_log(
    "NET/Plugin: Could not find: none libnccl-net-none.so.",
    "NET/Socket : Using [0]lo:127.0.0.1<0>",
    "Using network Socket",
    "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0")


class SizesAndFormulas(unittest.TestCase):
    def test_geometric_sizes_end_on_the_maximum(self):
        self.assertEqual(e.geometric_sizes(1, 256, 4), [1, 4, 16, 64, 256])
        self.assertEqual(e.geometric_sizes(1, 100, 4), [1, 4, 16, 64, 100])
        self.assertEqual(e.geometric_sizes(8, 8, 2), [8])
        sizes = e.geometric_sizes(1, 256 * e.MIB, 4)
        self.assertEqual((sizes[0], sizes[-1], len(sizes)), (1, 256 * e.MIB, 15))

    def test_geometric_sizes_rejects_bad_ranges(self):
        for lo, hi, f in ((0, 8, 2), (16, 8, 2), (1, 8, 1)):
            with self.assertRaises(ValueError):
                e.geometric_sizes(lo, hi, f)

    def test_elements_for(self):
        self.assertEqual(e.elements_for(1, 4), 1)        # below one element: still one
        self.assertEqual(e.elements_for(1, 1), 1)        # int8 covers the 1-byte case
        self.assertEqual(e.elements_for(1, 4, 2), 2)     # reduce_scatter splits evenly
        self.assertEqual(e.elements_for(1024, 4, 2), 256)
        self.assertEqual(e.elements_for(6, 1, 4), 8)

    def test_bus_factors_match_nccl_tests(self):
        # nccl-tests PERFORMANCE.md: allreduce 2(n-1)/n, allgather and
        # reducescatter (n-1)/n, broadcast and sendrecv 1.
        self.assertEqual(e.bus_factor("all_reduce", 2), 1.0)
        self.assertEqual(e.bus_factor("all_gather", 2), 0.5)
        self.assertEqual(e.bus_factor("reduce_scatter", 2), 0.5)
        self.assertAlmostEqual(e.bus_factor("all_reduce", 8), 1.75)
        self.assertAlmostEqual(e.bus_factor("all_gather", 8), 0.875)
        self.assertEqual(e.bus_factor("broadcast", 8), 1.0)
        self.assertEqual(e.bus_factor("sendrecv", 8), 1.0)
        self.assertEqual(set(e.OPS), {"all_reduce", "all_gather", "reduce_scatter", "broadcast", "sendrecv"})

    def test_fmt_bytes(self):
        self.assertEqual(e.fmt_bytes(1), "1 B")
        self.assertEqual(e.fmt_bytes(4096), "4 KiB")
        self.assertEqual(e.fmt_bytes(256 * e.MIB), "256 MiB")
        self.assertEqual(e.fmt_bytes(1536), "1536 B")

    def test_busbw_table_ratio(self):
        go = [{"bytes": 1024, "busbw_gbs": 2.0}, {"bytes": 4096, "busbw_gbs": 3.0}]
        so = [{"bytes": 1024, "busbw_gbs": 1.0}]
        rows = e.busbw_table("all_reduce", go, so)
        self.assertIn("| 1 KiB | 2.000 | 1.000 | 2.00 |", rows)
        self.assertIn("| 4 KiB | 3.000 | - | - |", rows)

    def test_parse_ops(self):
        self.assertEqual(e.parse_ops("sendrecv, broadcast"), ("broadcast", "sendrecv"))
        self.assertEqual(e.parse_ops(",".join(e.OPS)), e.OPS)
        for bad in ("", "bcast", "broadcast,alltoall"):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                e.parse_ops(bad)

    def test_busbw_runs_table_pairs_run_i_with_run_i(self):
        def run(*bw):
            return [{"bytes": 65536 << (2 * i), "busbw_gbs": b} for i, b in enumerate(bw)]
        go = [run(1.0, 4.0), run(3.0, 4.0), run(2.0, 4.0)]
        so = [run(1.0, 2.0), run(1.0, 1.0), run(4.0, 2.0)]
        rows = e.busbw_runs_table("broadcast", go, so)
        self.assertIn("| size | Go busbw median (GB/s) | Socket busbw median (GB/s) | Go / Socket min | median | "
                      "per run (3 pairs) |", rows)
        # Ratios 1.0, 3.0, 0.5: min 0.50, median 1.00 (not the ratio of the medians, 2.0 / 1.0).
        self.assertIn("| 64 KiB | 2.000 | 1.000 | 0.50 | 1.00 | 1.00 3.00 0.50 |", rows)
        self.assertIn("| 256 KiB | 4.000 | 2.000 | 2.00 | 2.00 | 2.00 4.00 2.00 |", rows)

    def test_busbw_runs_table_failed_run_gives_no_min(self):
        go = [[{"bytes": 1024, "busbw_gbs": 2.0}], None]
        so = [[{"bytes": 1024, "busbw_gbs": 1.0}], [{"bytes": 1024, "busbw_gbs": 1.0}]]
        rows = e.busbw_runs_table("sendrecv", go, so)
        self.assertIn("| 1 KiB | 2.000 | 1.000 | - | - | 2.00 - |", rows)


class BenchIterations(unittest.TestCase):
    def test_short_loops_are_stretched_to_the_minimum_time(self):
        # 100 broadcasts of 64 KiB at 70 us are 7 ms; 0.25 s needs 3572.
        self.assertEqual(e.iters_for_time(100, 70e-6, 0.25), 3572)

    def test_long_loops_keep_the_budget_count(self):
        self.assertEqual(e.iters_for_time(16, 0.020, 0.25), 16)

    def test_capped_and_off(self):
        self.assertEqual(e.iters_for_time(100, 1e-9, 0.25), e.BENCH_ITERS_CAP)
        self.assertEqual(e.iters_for_time(100, 70e-6, 0), 100)
        self.assertEqual(e.iters_for_time(100, 0.0, 0.25), 100)

    def test_rank_gets_the_setting(self):
        args = e.build_parser().parse_args(["suite", "--bench-min-time", "0.5"])
        self.assertEqual(args.bench_min_time, 0.5)
        self.assertEqual(e.build_parser().parse_args(["suite"]).bench_min_time, 0.25)


class NcclVersions(unittest.TestCase):
    def test_parse_nccl_version(self):
        self.assertEqual(e.parse_nccl_version((2, 27, 5)), (2, 27, 5))
        self.assertEqual(e.parse_nccl_version([2, 21]), (2, 21, 0))
        self.assertEqual(e.parse_nccl_version(21805), (2, 18, 5))
        self.assertEqual(e.parse_nccl_version(22005), (2, 20, 5))
        self.assertEqual(e.parse_nccl_version(2708), (2, 7, 8))

    def test_expected_api(self):
        cases = [((2, 19, 3), None, None), ((2, 20, 5), 8, None), ((2, 23, 4), 8, None),
                 ((2, 24, 3), 9, 9), ((2, 26, 2), 10, 10), ((2, 27, 7), 10, 10),
                 ((2, 28, 3), 11, 10), ((2, 29, 7), 11, 10), ((2, 30, 7), 12, 10), ((3, 0, 0), 12, 10)]
        for ver, full, v9v10 in cases:
            with self.subTest(ver=ver):
                self.assertEqual(e.expected_api(ver, e.FULL_EXPORTS), full)
                self.assertEqual(e.expected_api(ver, e.V9V10_EXPORTS), v9v10)

    def test_plugin_env_full_path_from_2_21(self):
        env = e.plugin_env((2, 21, 5), "/x/build/libnccl-net-go.so")
        self.assertEqual(env, {"NCCL_NET_PLUGIN": "/x/build/libnccl-net-go.so"})

    def test_plugin_env_short_name_before_2_21(self):
        old = os.environ.get("LD_LIBRARY_PATH")
        os.environ["LD_LIBRARY_PATH"] = "/usr/local/cuda/lib64"
        try:
            env = e.plugin_env((2, 20, 5), "/x/build/libnccl-net-go-v9v10.so")
        finally:
            if old is None:
                del os.environ["LD_LIBRARY_PATH"]
            else:
                os.environ["LD_LIBRARY_PATH"] = old
        self.assertEqual(env["NCCL_NET_PLUGIN"], "go-v9v10")
        self.assertEqual(env["LD_LIBRARY_PATH"], "/x/build:/usr/local/cuda/lib64")
        with self.assertRaises(e.UnsupportedMachine):
            e.plugin_env((2, 20, 5), "/x/build/myplugin.so")


class BenchVariant(unittest.TestCase):
    def test_parse_variant(self):
        self.assertIsNone(e.parse_variant(""))
        self.assertIsNone(e.parse_variant("  "))
        self.assertEqual(e.parse_variant("share0:NCCL_GO_SOCKET_SHARE_AFTER=0"),
                         ("share0", {"NCCL_GO_SOCKET_SHARE_AFTER": "0"}))
        self.assertEqual(e.parse_variant("h4:NCCL_GO_SOCKET_HELPERS=4, NCCL_SOCKET_NTHREADS=4"),
                         ("h4", {"NCCL_GO_SOCKET_HELPERS": "4", "NCCL_SOCKET_NTHREADS": "4"}))
        for bad in ("NCCL_GO_SOCKET_SHARE_AFTER=0", "Share:NCCL_X=1", "s:", "s:FOO=1", "s:NCCL_X",
                    "s:NCCL_X=1,NCCL_X=2", "s:NCCL_NET=Socket", "s:NCCL_NET_PLUGIN=other"):
            with self.subTest(bad=bad), self.assertRaises(ValueError):
                e.parse_variant(bad)

    def test_suite_vars_cover_what_rank_env_sets(self):
        # A variable the suite sets but a variant could also name would be
        # overridden silently: SUITE_VARS must list every one.
        args = e.build_parser().parse_args(["suite", "--cumem", "0"])
        env = e.rank_env({}, 0, "nccl", "Go", {"NCCL_NET_PLUGIN": "/x.so"}, args, "/log")
        self.assertEqual({k for k in env if k.startswith("NCCL_")} - e.SUITE_VARS, set())

    def test_variant_settings_reach_both_ranks(self):
        seen = []

        class Proc:
            returncode = 0
            pid = 0

            def poll(self):
                return 0

            def wait(self):
                return 0

        def popen(cmd, **kw):
            seen.append(kw["env"])
            return Proc()
        args = e.build_parser().parse_args(["suite", "--backend", "gloo"])
        with tempfile.TemporaryDirectory() as out, mock.patch.object(e.subprocess, "Popen", popen), \
                mock.patch.dict(os.environ, {"NCCL_GO_SOCKET_SHARE_AFTER": "100"}), \
                contextlib.redirect_stdout(io.StringIO()):
            for d in ("logs", "work"):
                os.makedirs(os.path.join(out, d))
            e.launch_phase("bench-go-share0", "bench", "Go", None, {}, args, out,
                           {"NCCL_GO_SOCKET_SHARE_AFTER": "0"})
            e.launch_phase("bench-go", "bench", "Go", None, {}, args, out)
        self.assertEqual([env["NCCL_GO_SOCKET_SHARE_AFTER"] for env in seen], ["0", "0", "100", "100"])

    def test_labelled_tables(self):
        a = [{"bytes": 1024, "busbw_gbs": 2.0}]
        b = [{"bytes": 1024, "busbw_gbs": 4.0}]
        rows = e.busbw_table("sendrecv", a, b, ("Go", "Go share0"))
        self.assertIn("| size | Go busbw (GB/s) | Go share0 busbw (GB/s) | Go / Go share0 |", rows)
        self.assertIn("| 1 KiB | 2.000 | 4.000 | 0.50 |", rows)
        rows = e.busbw_runs_table("sendrecv", [a, a], [b, a], ("Go share0", "Socket"))
        self.assertIn("| size | Go share0 busbw median (GB/s) | Socket busbw median (GB/s) | "
                      "Go share0 / Socket min | median | per run (2 pairs) |", rows)
        self.assertIn("| 1 KiB | 2.000 | 3.000 | 0.50 | 0.75 | 0.50 1.00 |", rows)


class RankEnvironment(unittest.TestCase):
    def args(self, **kw):
        ns = e.build_parser().parse_args(["suite"])
        for k, v in kw.items():
            setattr(ns, k, v)
        return ns

    def test_ranks_pose_as_two_hosts_on_the_network_only(self):
        base = {"NCCL_DEBUG_FILE": "/tmp/x.%h", "NCCL_NET_PLUGIN": "other", "PATH": "/bin"}
        envs = [e.rank_env(base, r, "nccl", "Go", {"NCCL_NET_PLUGIN": "/abs/libnccl-net-go.so"},
                           self.args(cumem="0"), f"/out/logs/x.rank{r}.nccl.log") for r in range(2)]
        self.assertNotEqual(envs[0]["NCCL_HOSTID"], envs[1]["NCCL_HOSTID"])
        for r, env in enumerate(envs):
            self.assertEqual(env["RANK"], str(r))
            self.assertEqual(env["WORLD_SIZE"], "2")
            self.assertEqual((env["NCCL_P2P_DISABLE"], env["NCCL_SHM_DISABLE"], env["NCCL_NVLS_ENABLE"]), ("1", "1", "0"))
            self.assertEqual(env["NCCL_NET"], "Go")
            self.assertEqual(env["NCCL_NET_PLUGIN"], "/abs/libnccl-net-go.so")
            self.assertEqual(env["NCCL_DEBUG"], "INFO")
            self.assertEqual(env["NCCL_DEBUG_SUBSYS"], "INIT,NET")
            self.assertEqual(env["NCCL_CUMEM_ENABLE"], "0")
            self.assertEqual(env["NCCL_DEBUG_FILE"], f"/out/logs/x.rank{r}.nccl.log")
            self.assertEqual(env["PATH"], "/bin")
        self.assertEqual(base["NCCL_NET_PLUGIN"], "other", "the caller's environment is not modified")

    def test_baseline_loads_no_external_plugin(self):
        env = e.rank_env({"NCCL_NET_PLUGIN": "go"}, 0, "nccl", "Socket", {"NCCL_NET_PLUGIN": "none"}, self.args())
        self.assertEqual((env["NCCL_NET"], env["NCCL_NET_PLUGIN"]), ("Socket", "none"))
        self.assertNotIn("NCCL_CUMEM_ENABLE", env)
        self.assertNotIn("NCCL_DEBUG_FILE", env, "no inherited NCCL_DEBUG_FILE may divert the log")


class LogChecks(unittest.TestCase):
    def test_good_logs_across_nccl_releases(self):
        for name, text, lib, api in (("2.27", LOG_2_27, "libnccl-net-go.so", 10),
                                     ("2.20", LOG_2_20, "libnccl-net-go.so", 8)):
            with self.subTest(nccl=name):
                problems, facts = e.check_log(text, "Go", library=lib, expect_api=api)
                self.assertEqual(problems, [])
                self.assertEqual(facts["api"], api)
                self.assertEqual(facts["nccl_loaded_api"], api)
                self.assertEqual(facts["transport"], "socket")
                self.assertEqual(facts["plugin_version"], "0.1.0")
                self.assertEqual(facts["connections"], {"NET/Go": 3})
                self.assertEqual(facts["using_network"], ["Go"])
                self.assertIn(lib, facts["library_line"])

    def test_library_line_alone_is_enough(self):
        text = LOG_2_27.replace("Loaded net plugin Go (v10)", "something else")
        problems, facts = e.check_log(text, "Go", library="libnccl-net-go.so", expect_api=10)
        self.assertEqual(problems, [])
        self.assertNotIn("nccl_loaded_api", facts)

    def test_plugin_must_be_named_by_nccl(self):
        problems, _ = e.check_log(LOG_NO_NCCL_PLUGIN_LINES, "Go", library="libnccl-net-go.so", expect_api=10)
        self.assertTrue(any("NET/Plugin" in p for p in problems), problems)

    def test_wrong_api_version_fails(self):
        problems, _ = e.check_log(LOG_2_27, "Go", library="libnccl-net-go.so", expect_api=11)
        self.assertTrue(any("expected v11" in p for p in problems), problems)

    def test_nccl_and_plugin_disagree_on_api(self):
        text = LOG_2_27.replace("Loaded net plugin Go (v10)", "Loaded net plugin Go (v9)")
        problems, _ = e.check_log(text, "Go", library="libnccl-net-go.so")
        self.assertTrue(any("loaded v9" in p for p in problems), problems)

    def test_missing_plugin_init_line_fails(self):
        text = LOG_2_27.replace(GO_INIT_V10, "NET/Plugin: something")
        problems, _ = e.check_log(text, "Go", library="libnccl-net-go.so")
        self.assertTrue(any("did not initialise" in p for p in problems), problems)

    def test_p2p_or_shm_connections_fail(self):
        for via in ("P2P/IPC", "SHM/direct/direct", "P2P/CUMEM/read"):
            with self.subTest(via=via):
                text = LOG_2_27 + nccl_log(f"Channel 02/0 : 0[0] -> 1[0] via {via}")
                problems, _ = e.check_log(text, "Go", library="libnccl-net-go.so", expect_api=10)
                self.assertTrue(any("not over the network" in p for p in problems), problems)

    def test_other_network_fails(self):
        text = LOG_2_27 + nccl_log("Channel 02/0 : 0[0] -> 1[0] [send] via NET/IB/0")
        problems, _ = e.check_log(text, "Go", library="libnccl-net-go.so", expect_api=10)
        self.assertTrue(any("another network" in p for p in problems), problems)

    def test_no_connection_lines_fail(self):
        text = "\n".join(l for l in LOG_2_27.splitlines() if "via" not in l)
        problems, _ = e.check_log(text, "Go", library="libnccl-net-go.so", expect_api=10)
        self.assertTrue(any("no 'via NET" in p for p in problems), problems)

    def test_our_warnings_fail_and_others_are_reported(self):
        text = LOG_2_27 + nccl_log("WARN NET/Go : isend request of 4096 bytes with 127.0.0.1 failed",
                                   "WARN Cuda failure 'not supported' (harmless here)")
        problems, facts = e.check_log(text, "Go", library="libnccl-net-go.so", expect_api=10)
        self.assertEqual(len(problems), 1, problems)
        self.assertIn("WARN", problems[0])
        self.assertEqual(len(facts["warnings"]), 2)

    def test_socket_baseline(self):
        problems, facts = e.check_log(LOG_SOCKET, "Socket")
        self.assertEqual(problems, [])
        self.assertEqual(facts["connections"], {"NET/Socket": 2})
        problems, _ = e.check_log(LOG_SOCKET + nccl_log(GO_INIT_V10), "Socket")
        self.assertTrue(any("our plugin initialised" in p for p in problems), problems)
        problems, _ = e.check_log(LOG_2_27, "Socket")
        self.assertTrue(any("Socket transport" in p for p in problems), problems)

    def test_checklog_command(self):
        with tempfile.TemporaryDirectory() as d:
            good, bad = os.path.join(d, "good.log"), os.path.join(d, "bad.log")
            with open(good, "w") as f:
                f.write(LOG_2_27)
            with open(bad, "w") as f:
                f.write(LOG_2_27.replace("via NET/Go", "via P2P"))
            run = lambda *a: subprocess.run([sys.executable, SCRIPT, "checklog", *a],  # noqa: E731
                                            capture_output=True, text=True, timeout=60)
            self.assertEqual(run("--nccl-version", "2.27.5", good).returncode, e.EXIT_OK)
            self.assertEqual(run("--nccl-version", "2.28.3", good).returncode, e.EXIT_FAIL)  # v11 expected
            self.assertEqual(run("--nccl-version", "2.28.3", "--v9v10", good).returncode, e.EXIT_OK)
            r = run(bad)
            self.assertEqual(r.returncode, e.EXIT_FAIL)
            self.assertIn("not over the network", r.stdout)


class KillCheck(unittest.TestCase):
    def test_parse_kill_arms(self):
        self.assertEqual(e.parse_kill_arms(e.KILL_ARMS_DEFAULT),
                         [("go-fork", 3), ("go", 1), ("socket-fork", 1), ("socket", 1)])
        self.assertEqual(e.parse_kill_arms("socket, go-fork:2,"), [("socket", 1), ("go-fork", 2)])
        for bad, why in (("", "no arms"), ("ib:1", "unknown arm"), ("go:x", "must be a number"),
                         ("go:0", "1..20"), ("go:21", "1..20"), ("go,go:2", "twice")):
            with self.assertRaisesRegex(ValueError, why):
                e.parse_kill_arms(bad)

    def test_only_our_plugin_is_judged(self):
        for arm, (net, ours, _) in e.KILL_ARMS.items():
            self.assertEqual(ours, net == "Go", arm)
            judged, ok, text = e.kill_verdict(arm, "hang", None, 20)
            self.assertEqual((judged, ok), (ours, False))
            self.assertIn("HANG", text)

    def test_verdicts(self):
        self.assertEqual(e.kill_verdict("go-fork", "error", 0.512, 20), (True, True, "error after 0.51 s"))
        self.assertEqual(e.kill_verdict("go", "exit", 1.5, 20), (True, True, "survivor exited after 1.50 s"))
        judged, ok, text = e.kill_verdict("go", "completed", 0.1, 20)
        self.assertEqual((judged, ok), (True, False))
        self.assertIn("COMPLETED", text)

    def test_teardown_lines_and_cells(self):
        log = nccl_log("comm 0x1a645320 rank 0 nRanks 2 cudaDev 0 busId 60 - Abort START",
                       "comm 0x1a645320 rank 0 nranks 2 cudaDev 0 busId 60 - Abort COMPLETE",
                       "comm 0x2b0 rank 1 nranks 2 cudaDev 0 busId 60 - Destroy COMPLETE")
        self.assertEqual([m.group(1) for m in e.RE_TEARDOWN.finditer(log)], ["Abort COMPLETE", "Destroy COMPLETE"])
        self.assertEqual(e.teardown_cell(None), "-")
        self.assertEqual(e.teardown_cell({"outcome": "done", "seconds": 0.126}), "0.13")
        self.assertEqual(e.teardown_cell({"outcome": "raised", "seconds": 1.0}), "raised 1.00")
        self.assertEqual(e.teardown_cell({"outcome": "hang"}), "hang")

    def test_bad_arms_are_a_usage_error(self):
        r = subprocess.run([sys.executable, SCRIPT, "kill", "--arms", "go:0"], capture_output=True, text=True)
        self.assertEqual(r.returncode, e.EXIT_USAGE, r.stderr)
        self.assertIn("--arms", r.stderr)


class CannotRunHere(unittest.TestCase):
    def run_suite(self, extra_env, *args):
        env = dict(os.environ, **extra_env)
        return subprocess.run([sys.executable, SCRIPT, "suite", "--plugin", "/nonexistent.so", *args],
                              capture_output=True, text=True, env=env, timeout=300)

    def test_no_torch_exits_77_with_reason(self):
        with tempfile.TemporaryDirectory() as d:
            os.makedirs(os.path.join(d, "torch"))
            with open(os.path.join(d, "torch", "__init__.py"), "w") as f:
                f.write("raise ImportError('No module named torch (simulated by the e2e self test)')\n")
            r = self.run_suite({"PYTHONPATH": d}, "--out", os.path.join(d, "out"))
        self.assertEqual(r.returncode, e.EXIT_UNSUPPORTED, r.stderr)
        self.assertIn("PyTorch is not importable", r.stderr)
        self.assertIn("nothing was tested", r.stderr)

    def test_no_cuda_exits_77_with_reason(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is not installed here (apt package python3-torch); "
                          "the no-torch path is covered by test_no_torch_exits_77_with_reason")
        if torch.cuda.is_available():
            self.skipTest("this machine has a CUDA GPU, so the no-GPU path cannot be shown")
        with tempfile.TemporaryDirectory() as d:
            r = self.run_suite({}, "--out", os.path.join(d, "out"))
        self.assertEqual(r.returncode, e.EXIT_UNSUPPORTED, r.stderr)
        self.assertIn("sees no CUDA GPU", r.stderr)

    def test_bad_sizes_are_a_usage_error(self):
        r = subprocess.run([sys.executable, SCRIPT, "suite", "--factor", "1"], capture_output=True, text=True,
                           timeout=60)
        self.assertEqual(r.returncode, e.EXIT_USAGE, r.stderr)


if __name__ == "__main__":
    unittest.main()
