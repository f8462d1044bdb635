"""Wheels of this package timed side by side in one run on one GPU: the A/B of a kernel change.

Each wheel is installed into a directory of its own; then, round after round, each wheel in turn
times the chosen shapes of the peers' compare.py (its inputs, its error measure, its timing) in a
fresh process that imports the package from that directory. Machines drift 5-10% between runs, so
only ratios within one such run compare; the rounds show the run's own spread. The first wheel is
the base. Ours only: compare.py --set all is the table beside the peers.

Usage, on the GPU machine with the peers copied into the checkout (.peers/, ignored):
  python3 ci/ab.py [--peers .peers] [--rounds 2] [--precision exact] [--precision fast]
                   --only "D 4096;V4-Flash DP h64 SWA" BASE.whl CANDIDATE.whl [...]
(--only: shapes whose names start with each ;-separated text, compare.py's and EXTRA_SHAPES below;
--precision, repeated: default exact.
A wheel named as WHEEL@4 runs with out 4 bytes past a 16-byte boundary, the layout otherwise the same,
so that the kernels take their unaligned store path: `BASE.whl BASE.whl@4` times the two store paths.)
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

D_V = 512  # the d_v of every shape of compare.py (prefill()'s default)
# rows compare.py lacks, in its shapes' form: h_q 64 at d_qk 576 (DeepSeek-V3.2 at two-way tensor
# parallelism, topk 2048, and the same at topk 512), where the exact dual has two landing half tiles
EXTRA_SHAPES = {
    "X576 4096,32768,64,576,512": (4096, 32768, 64, 576, 512, None, False),
    "V3.2 TP2 h64": (4096, 32768, 64, 576, 2048, None, False),
}


def time_shapes(peers, shapes, precisions, out_offset):
    """In the child: each shape in each precision, one line each: shape, precision, µs, errors."""
    sys.path.insert(0, peers)
    import compare  # noqa: E402 (the peers' module: torch, the workloads, do_bench, errors)
    import torch

    table = {**compare.CONTRACT, **compare.SERVING, **EXTRA_SHAPES}
    print(f"# {compare.smf.__file__}", flush=True)
    for key in shapes:
        name = next((n for n in table if n.startswith(key)), None)
        if name is None:
            sys.exit(f"no shape of compare.py starts with {key!r}")
        s_q, s_kv, h_q, d_qk, width, profile, use_sink = table[name]
        q, kv, idx, tl, sink = compare.workload(s_q, s_kv, h_q, d_qk, width, profile)
        sk = sink if use_sink else None
        ones = torch.ones(1, device=compare.dev)
        sm = d_qk ** -0.5
        out = None
        if out_offset:
            pad = out_offset // 2  # bf16 elements
            out = torch.empty(s_q * h_q * D_V + pad, dtype=torch.bfloat16, device=compare.dev)[pad:].view(s_q, h_q, D_V)
        for precision in precisions:
            def run():
                return compare.smf.prefill(q, kv, idx, sm, q_scale=ones, kv_scale=ones, attn_sink=sk,
                                           topk_length=tl, out=out, precision=precision)
            err = compare.errors(run(), q, kv, idx, sm, sk, tl)
            us = compare.do_bench(run) * 1e3
            print(f"{name}\t{precision}\t{us:.1f}\t{err}", flush=True)
        del q, kv, idx, out
        torch.cuda.empty_cache()


def install(paths, work):
    """Each distinct wheel into a directory of its own under work: per entry, its directory."""
    installed = {}
    for path in paths:
        if path not in installed:
            installed[path] = os.path.join(work, str(len(installed)))
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target",
                            installed[path], path], check=True)
    return [installed[path] for path in paths]


def measure(child, sites, offsets, rounds):
    """Round after round, each entry in a fresh process: (shape, precision) -> per entry, its µs per
    round; and the entries whose process failed (a kernel fault), which are left out of later rounds
    so that the others' rounds still complete."""
    times, failed = {}, set()
    for r in range(rounds):
        for i, (site, offset) in enumerate(zip(sites, offsets)):
            if i in failed:
                continue
            env = dict(os.environ, PYTHONPATH=site + os.pathsep + os.environ.get("PYTHONPATH", ""))
            proc = subprocess.run(child + [f"--out-offset={offset}"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
            if proc.returncode != 0:
                failed.add(i)
                tail = "\n  ".join(proc.stderr.strip().splitlines()[-6:])
                print(f"round {r + 1} wheel {i} FAILED (exit {proc.returncode}); left out from here:\n  {tail}",
                      flush=True)
            for line in proc.stdout.splitlines():
                if line.startswith("#"):
                    if not line.startswith(f"# {site}"):
                        sys.exit(f"wheel {i} imported {line[2:]}, not its own copy in {site}")
                    continue
                name, precision, us, err = line.split("\t")
                times.setdefault((name, precision), [[] for _ in sites])[i].append(float(us))
                print(f"round {r + 1} wheel {i} | {name} | {precision} | {us} µs | out/lse/max_logits {err}", flush=True)
    return times, failed


def cell(t, base):
    """A wheel's median µs, its rounds and its speedup over wheel 0's median base (none timed: "-")."""
    if not t:
        return "-"
    return f"{statistics.median(t):.1f} ({'/'.join(f'{x:.0f}' for x in t)})" + (
        f", {base / statistics.median(t):.3f}x" if base else "")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("wheels", nargs="*")
    ap.add_argument("--only", required=True)
    ap.add_argument("--peers", default=".peers")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--precision", action="append", choices=["exact", "fast"])
    ap.add_argument("--out-offset", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--time-in-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes, precisions, peers = args.only.split(";"), args.precision or ["exact"], os.path.abspath(args.peers)
    if args.time_in_child:
        return time_shapes(peers, shapes, precisions, args.out_offset)
    if not args.wheels:
        ap.error("name the wheels, the base first")
    entries = [wheel.partition("@")[::2] for wheel in args.wheels]  # (path, out offset)
    if any(offset not in ("", "4", "8", "12") for _, offset in entries):
        ap.error("an out offset (WHEEL@N) is 4, 8 or 12 bytes")
    offsets = [int(offset or 0) for _, offset in entries]
    child = [sys.executable, os.path.abspath(__file__), "--time-in-child", "--peers", peers, "--only", args.only]
    child += [f"--precision={p}" for p in precisions]
    with tempfile.TemporaryDirectory(prefix="sparse-mla-ab-") as work:
        sites = install([path for path, _ in entries], work)
        times, failed = measure(child, sites, offsets, args.rounds)
    print("\nshape | precision | " + " | ".join(f"wheel {i}: median µs (rounds), speedup over wheel 0"
                                                for i in range(len(sites))))
    for (name, precision), per_wheel in times.items():
        base = statistics.median(per_wheel[0]) if per_wheel[0] else None
        print(f"{name} | {precision} | " + " | ".join(cell(t, base) for t in per_wheel))
    print("\nwheels: " + "; ".join(f"{i} {os.path.abspath(w)}" for i, w in enumerate(args.wheels)))
    if failed:
        sys.exit("failed: " + ", ".join(f"wheel {i}" for i in sorted(failed)) + " (their rounds before it are above)")


if __name__ == "__main__":
    main()
