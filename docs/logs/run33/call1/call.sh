#!/usr/bin/env bash
# run 33 call 1 (carried as .carry/x/call.sh with .carry/t, .carry/lib and
# .carry/x/x.tar.xz: the bench-variants bench_long at 08a608b + the
# HYLO_GDN_SLICES / HYLO_GDN_STEP knobs): validation of HEAD's kernels, the
# decode cluster rule, the GDN step's slices swept, ncu of the GDN step and MLA decode
tar xJf .carry/x/x.tar.xz || exit 1
TESTS="core model attn gdn" VARIANTS=none TRACE=1 LONG_LIMIT=90 REF=0 bash scripts/gpu/kernel_checks.sh
for c in 1 8; do HYLO_DEC_CLUSTER=$c timeout 60 build/bench-variants/bench/bench_decode --quick > $OUT/dec_cluster$c.txt 2>&1; done
export LD_LIBRARY_PATH=$PWD/.carry/lib:/usr/local/cuda/lib64
G=$OUT/gdn_slices.txt
for v in "HYLO_GDN_SLICES=0" "HYLO_GDN_SLICES=1" "HYLO_GDN_SLICES=2" "HYLO_GDN_SLICES=4" "HYLO_GDN_SLICES=16" "HYLO_GDN_STEP=1" "HYLO_GDN_SLICES=0"; do
    echo "== $v" >> $G
    env $v timeout 40 build/bench-variants/bench/bench_long --smollm2 --trace > /tmp/t.txt 2>&1; echo "rc=$?" >> $G
    grep -E "T=256|k_gdn_step |k_gemv_add_rmsnorm |k_mla_decode2 |^  step" /tmp/t.txt >> $G
done
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1); echo "ncu=$NCU" > $OUT/ncu.txt
timeout 150 $NCU --clock-control none -k regex:"k_gdn_step|k_mla_decode2" --launch-skip 40 --launch-count 4 --section SpeedOfLight --section WarpStateStats --section LaunchStats --section Occupancy build/bench/bench_long --smollm2 >> $OUT/ncu.txt 2>&1
echo "ncu rc=$?" >> $OUT/ncu.txt
ls -la $OUT
