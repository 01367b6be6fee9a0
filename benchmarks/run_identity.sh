#!/bin/bash
# Byte identity of training: short CPU runs of every kind with fixed seeds, then the sha256 of every weight and
# optimizer file and of every metrics.jsonl (timing fields left out). Run it on the code before and after a change
# that must not change the numbers (a refactor, a kernel, `--kernels auto`): the two lists must be identical.
#
#   benchmarks/run_identity.sh SOURCE_TREE OUT_DIR [extra options for every pretrain/finetune, e.g. --kernels auto]
#
# The runs: pretraining fp32 and bf16 (tiny preset, two books), a pretraining stopped at update 2 and resumed to 4
# (its step-4 files must equal the uninterrupted run's), CoLA fine-tuning packed, padded with micro-batches, and with
# step checkpoints, RTE fine-tuning in bf16, and a quickstart with a fixed number of updates. Needs ../shared/data
# beside the tree (or GPT1_SHARED); about a minute on 2 idle cores.
set -euo pipefail
WT=$(cd "$1" && pwd); OUT=$2; shift 2
SHARED=${GPT1_SHARED:-$WT/../shared}
export PYTHONPATH=$WT OMP_NUM_THREADS=1 GPT1_CACHE=$OUT/cache GPT1_MODELS=$OUT/models HF_HUB_OFFLINE=1
rm -rf "$OUT"; mkdir -p "$OUT"
B=$SHARED/data/books
cd "$WT"
G="python3 -m gptcli"
$G prepare $B/pg244_study_in_scarlet.txt $B/pg55_wonderful_wizard_of_oz.txt --strip-gutenberg \
  --split-by paragraph --vocab-size 4000 --val-fraction 0.1 --out $OUT/corpus > $OUT/prepare.log 2>&1
PT="--data $OUT/corpus --preset tiny --batch-size 8 --seq-len 256 --eval-batches 2 --seed 7 --warmup-steps 1 --lr 1e-3
    --device cpu --quiet"
$G pretrain $PT --max-steps 4 --eval-every 2 --save-every 4 --precision fp32 --out $OUT/pre "$@" > $OUT/pre.log 2>&1
$G pretrain $PT --max-steps 3 --eval-every 3 --precision bf16 --out $OUT/pre-bf16 "$@" > $OUT/pre-bf16.log 2>&1
$G pretrain $PT --max-steps 2 --eval-every 2 --save-every 2 --precision fp32 --out $OUT/pre-res "$@" \
  > $OUT/pre-res1.log 2>&1
$G pretrain $PT --max-steps 4 --eval-every 2 --save-every 4 --precision fp32 --out $OUT/pre-res --resume "$@" \
  > $OUT/pre-res2.log 2>&1
FT="--task cola --init $OUT/pre --data-dir $SHARED/data/glue/CoLA --max-train-examples 96 --max-eval-examples 32
    --batch-size 16 --seed 7 --device cpu --precision fp32 --no-cache"
$G finetune $FT --epochs 1 --out $OUT/ft "$@" > $OUT/ft.log 2>&1
$G finetune $FT --epochs 2 --layout padded --micro-batch-size 5 --out $OUT/ft-padded "$@" > $OUT/ft-padded.log 2>&1
$G finetune $FT --epochs 2 --save-every 3 --out $OUT/ft-steps "$@" > $OUT/ft-steps.log 2>&1
$G finetune --task rte --init $OUT/pre --data-dir $SHARED/data/glue/RTE --max-train-examples 48 \
  --max-eval-examples 16 --batch-size 8 --seed 3 --device cpu --precision bf16 --no-cache --epochs 1 \
  --out $OUT/ft-rte "$@" > $OUT/ft-rte.log 2>&1
$G quickstart --out $OUT/qs --pretrain-steps 6 --max-modules 60 --max-train-examples 64 --device cpu --seed 1 "$@" \
  > $OUT/qs.log 2>&1
cd "$OUT"
find pre pre-bf16 pre-res ft ft-padded ft-steps ft-rte qs -name '*.safetensors' | sort | xargs sha256sum
for f in $(find pre pre-res ft ft-padded ft-steps ft-rte -name metrics.jsonl | sort); do
  python3 - "$f" <<'PY'
import hashlib, json, sys
timing = ("elapsed_s", "tokens_per_s", "mfu")
lines = [json.dumps({k: v for k, v in json.loads(x).items() if k not in timing}, sort_keys=True) for x in open(sys.argv[1])]
print(hashlib.sha256("".join(lines).encode()).hexdigest(), sys.argv[1], "(metrics without timings)")
PY
done
