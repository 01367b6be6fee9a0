#!/bin/bash
# Byte identity of the CPU kernels: a short CPU pretraining run (tiny preset, fp32 and bf16) and a short CoLA
# fine-tuning run from it, fixed seeds; prints the sha256 of every weight and optimizer file. Run it with the code
# before and after a change to the model or its kernels (`--kernels auto`): the two lists must be identical.
#
#   benchmarks/kernels_identity.sh SOURCE_TREE OUT_DIR [--kernels auto]
#
# Needs ../shared/data (two books, GLUE CoLA) beside the tree, or GPT1_SHARED; about 30 s on 2 idle cores.
set -euo pipefail
WT=$(cd "$1" && pwd); OUT=$2; shift 2
SHARED=${GPT1_SHARED:-$WT/../shared}
export PYTHONPATH=$WT OMP_NUM_THREADS=1 GPT1_CACHE=$OUT/cache GPT1_MODELS=$OUT/models HF_HUB_OFFLINE=1
rm -rf "$OUT"; mkdir -p "$OUT"
B=$SHARED/data/books
cd "$WT"
python3 -m gptcli prepare $B/pg244_study_in_scarlet.txt $B/pg55_wonderful_wizard_of_oz.txt --strip-gutenberg \
  --split-by paragraph --vocab-size 4000 --val-fraction 0.1 --out $OUT/corpus > $OUT/prepare.log 2>&1
python3 -m gptcli pretrain --data $OUT/corpus --preset tiny --max-steps 4 --batch-size 8 --seq-len 256 \
  --eval-every 2 --eval-batches 2 --save-every 4 --seed 7 --warmup-steps 1 --lr 1e-3 --device cpu --precision fp32 \
  --out $OUT/pre --quiet "$@" > $OUT/pretrain.log 2>&1
python3 -m gptcli pretrain --data $OUT/corpus --preset tiny --max-steps 3 --batch-size 8 --seq-len 256 \
  --eval-every 3 --eval-batches 2 --seed 7 --warmup-steps 1 --lr 1e-3 --device cpu --precision bf16 \
  --out $OUT/pre-bf16 --quiet "$@" > $OUT/pretrain-bf16.log 2>&1
python3 -m gptcli finetune --task cola --init $OUT/pre --data-dir $SHARED/data/glue/CoLA --max-train-examples 96 \
  --max-eval-examples 32 --batch-size 16 --epochs 1 --seed 7 --device cpu --precision fp32 --out $OUT/ft \
  --no-cache "$@" > $OUT/finetune.log 2>&1
cd "$OUT" && find pre pre-bf16 ft -name '*.safetensors' | sort | xargs sha256sum
