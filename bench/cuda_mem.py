#!/usr/bin/env python3
"""CUDA memory case of birkhoff's Sinkhorn attention: long sequences that an
N x N implementation cannot hold.

Usage (from the repository root, on a machine with one CUDA GPU):
  python3 bench/cuda_mem.py --out $OUT/mem.json     # < 60 s on an H100
Options as bench/cuda_bench.py (--quick, --budget-s, --grace-s, --reps, --warmup, --lib).
Without a CUDA device it prints 'SKIP: no CUDA device' and exits 0.

Shape: B=1, H=4 (B*H = 4), d=64, S=5 half-steps (iters=5), eps=1, bf16.
Cases, in this order:
  ours_sinkhorn bf16 at N = 16384, 32768, 65536: forward and forward+backward
      (backward of sum(out * g)) through birkhoff.torch.sinkhorn_attention,
      torch.cuda.max_memory_allocated per phase (reset before each), median
      time of a few reps (1 warm-up); at 65536 the output and gradients are
      also checked finite;
  eager (bench/peers/sinkformer_torch.attention, all-bf16) at N = 65536:
      forward only, expected to run out of memory (one N x N bf16 matrix of
      the 4 heads is 32 GiB): recorded as OOM with the peak reached;
  eager at N = 16384 (forward and forward+backward, for comparison) and at
      N = 32768 (forward only).
Harness, outputs (--out JSON, .md beside it, markdown on stdout) and
robustness: bench/cuda_bench.py.
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cuda_bench as cb  # noqa: E402


def mem_cases(args):
    tiny = args._tiny
    B, H = (1, 2) if tiny else (1, 4)
    Ns = [128, 256, 512] if tiny else [16384, 32768, 65536]
    reps = 3 if args.quick else min(args.reps, 5)
    cs = []
    for N in Ns:
        cs.append(cb.case("ours_sinkhorn_bf16_N%d" % N, "ours_sinkhorn", "bf16", N, B, H,
                          phases=("fwd", "fwdbwd"), warmup=1, reps=reps, min_reps=1,
                          validate=(N == Ns[-1])))
    cs.append(cb.case("eager_bf16_N%d" % Ns[-1], "eager", "bf16", Ns[-1], B, H, phases=("fwd",),
                      warmup=1, reps=1, min_reps=1))
    cs.append(cb.case("eager_bf16_N%d" % Ns[0], "eager", "bf16", Ns[0], B, H, phases=("fwd", "fwdbwd"),
                      warmup=1, reps=min(reps, 3), min_reps=1))
    cs.append(cb.case("eager_bf16_N%d" % Ns[1], "eager", "bf16", Ns[1], B, H, phases=("fwd",),
                      warmup=1, reps=1, min_reps=1))
    return cs


def peak(c, ph):
    pr = (c.get("phases_result") or {}).get(ph) or {}
    return pr.get("peak_mem_bytes", pr.get("peak_mem_bytes_before_oom"))


def mem_summarize(cases):
    S = {}
    for c in cases:
        if c.get("impl") not in ("ours_sinkhorn", "eager"):
            continue
        NN_bytes = c["B"] * c["H"] * c["N"] * c["N"] * 2
        S[c["id"]] = {
            "status": c.get("status"), "N": c["N"], "impl": c["impl"],
            "fwd_ms": cb.ms(c, "fwd"), "fwdbwd_ms": cb.ms(c, "fwdbwd"),
            "fwd_peak_bytes": peak(c, "fwd"), "fwdbwd_peak_bytes": peak(c, "fwdbwd"),
            "one_NxN_bf16_matrix_bytes": NN_bytes,
            "validate": (c.get("notes") or {}).get("validate")}
    ours = sorted((v for v in S.values() if v["impl"] == "ours_sinkhorn"), key=lambda v: v["N"])
    big = ours[-1] if ours else None
    ev = [v for v in S.values() if v["impl"] == "eager" and big and v["N"] == big["N"]]
    verdict = {}
    if big:
        verdict["ours_largest_N"] = big["N"]
        verdict["ours_fwdbwd_ran"] = big["fwdbwd_ms"] is not None
        verdict["ours_fwdbwd_peak_GiB"] = None if big["fwdbwd_peak_bytes"] is None else big["fwdbwd_peak_bytes"] / 2 ** 30
        verdict["ours_fwdbwd_ms"] = big["fwdbwd_ms"]
        verdict["one_NxN_bf16_matrix_GiB"] = big["one_NxN_bf16_matrix_bytes"] / 2 ** 30
    if ev:
        verdict["eager_same_N_status"] = ev[0]["status"]
    return {"summary": S, "verdict": verdict}


def mem_markdown(doc):
    cases = doc["cases"]
    L = cb.md_header(doc, "birkhoff CUDA memory case (B=1, H=4, d=64, S=5, eps=1, bf16)")
    L += ["| case | impl | N | fwd ms | fwd+bwd ms | peak MiB fwd | peak MiB fwd+bwd | above inputs MiB (fwd+bwd) "
          "| one N x N bf16 MiB | fwd TFLOP/s | status |",
          "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cases:
        P = c.get("phases_result") or {}
        stat = cb.status_text(c, P, 240)
        for ph, pr in P.items():
            if pr.get("reps"):
                stat += " [%s: %d reps]" % (ph, pr["reps"])
        v = (c.get("notes") or {}).get("validate")
        if v:
            stat += " [validate: %s]" % cb.json.dumps(v)[:200]
        L.append("| %s | %s | %d | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            c["id"], c["impl"], c["N"], cb.fnum(cb.ms(c, "fwd")), cb.fnum(cb.ms(c, "fwdbwd")),
            cb.mib(peak(c, "fwd")), cb.mib(peak(c, "fwdbwd")),
            cb.mib((P.get("fwdbwd") or {}).get("peak_mem_above_inputs_bytes")),
            cb.mib(c["B"] * c["H"] * c["N"] * c["N"] * 2), cb.fnum(c.get("fwd_tflops"), "%.1f"),
            stat.replace("|", "/")))
    L += ["", "Verdict: " + cb.json.dumps(doc.get("verdict", {})), "",
          "Peaks are torch.cuda.max_memory_allocated after a reset before each phase (inputs q, k, v, g "
          "included; for OOM rows the peak reached before the failure). " + cb.COUNTING_RULE]
    return "\n".join(L)


MEM_SPEC = dict(name="cuda_mem", default_out="mem.json", cases=mem_cases,
                summarize=mem_summarize, markdown=mem_markdown)

if __name__ == "__main__":
    sys.exit(cb.entry(MEM_SPEC, __file__, "CUDA memory case of birkhoff Sinkhorn attention",
                      budget=44.0, grace=12.0, reps=5))
